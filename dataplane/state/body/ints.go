package body

import (
	"encoding/binary"
	"math/bits"
	"strconv"
)

// AppendInts appends vals as a JSON array of integers to dst, as json.Marshal writes them. A
// prompt's token ids go to every leg as such an array: an id (below 10^6, as every vocabulary's
// are) is written as digits computed in one 64-bit word and stored at once, more than twice
// strconv's speed.
func AppendInts(dst []byte, vals []int) []byte {
	return append(AppendIntList(append(dst, '['), vals, false), ']')
}

// AppendIntList appends vals as AppendInts does, without the brackets: joined by commas, and
// after one when comma is true (a list continued).
func AppendIntList(dst []byte, vals []int, comma bool) []byte {
	const per = 7 // a comma and six digits (and 8 bytes of slack: a store writes 8)
	b, n := reserve(dst, per*len(vals)+8)
	for i, v := range vals {
		if i > 0 || comma {
			b[n] = ','
			n++
		}
		if uint(v) >= 1e6 { // negative, or past any vocabulary: strconv's
			out := strconv.AppendInt(b[:n], int64(v), 10)
			b, n = reserve(out, per*(len(vals)-i-1)+8)
			continue
		}
		u := uint32(v)
		d := uint32(bits.Len32(u|1)*1233) >> 12 // log10(u) or one less
		if u >= pow10[d] {
			d++
		}
		d = max(d, 1)              // the number of digits
		hi, lo := u/10000, u%10000 // hi < 100
		x := uint64(digitPairs[hi]) | uint64(digitPairs[lo/100])<<16 | uint64(digitPairs[lo%100])<<32
		binary.LittleEndian.PutUint64(b[n:], x>>(8*(6-d))) // the d digits, then zeros the next value overwrites
		n += int(d)
	}
	return b[:n]
}

// reserve returns dst's array, at least room bytes past len(dst) long, and len(dst).
func reserve(dst []byte, room int) ([]byte, int) {
	if cap(dst)-len(dst) < room {
		dst = append(make([]byte, 0, len(dst)+room), dst...)
	}
	return dst[:cap(dst)], len(dst)
}

// digitPairs[i] is the two ASCII digits of i (00 to 99), the first in the low byte.
var digitPairs = func() (t [100]uint16) {
	for i := range t {
		t[i] = uint16('0'+i/10) | uint16('0'+i%10)<<8
	}
	return t
}()

var pow10 = [...]uint32{1, 10, 100, 1000, 10000, 100000, 1000000}
