package body

import (
	"encoding/binary"
	"strconv"
)

// AppendInts appends vals as a JSON array of integers to dst, as json.Marshal writes them. A
// prompt's token ids go to every leg as such an array: an id below 10^6 (every vocabulary's
// are) is written from two tables, its digits and its comma stored in one 8-byte write.
func AppendInts(dst []byte, vals []int) []byte {
	b, n := reserve(dst, IntListRoom(len(vals))+2)
	return append(AppendIntList(append(b[:n], '['), vals, false), ']')
}

// AppendIntList appends vals as AppendInts does, without the brackets: joined by commas, and
// after one when comma is true (a list continued).
func AppendIntList(dst []byte, vals []int, comma bool) []byte {
	b, n := reserve(dst, IntListRoom(len(vals)))
	return appendIntList(b, n, vals, comma)
}

// intListSlack is the bytes past a list its writing may store to: an id's digits are stored
// eight bytes at a time.
const intListSlack = 7

// IntListRoom is the room past a slice's length that AppendIntList needs for n ids below 10^6
// (every vocabulary's), after a comma or not: seven bytes an id (a comma and six digits) and the
// slack of the last store. Given it, a list is written in place; a caller that writes one list
// in pieces (AppendIntList continued) makes its room once.
func IntListRoom(n int) int { return 7*n + intListSlack }

// appendIntList writes vals after b[:n], b's room past n at least what the list needs and
// intListSlack bytes more (reserve it grows by, after an id past 10^6), and returns the slice.
func appendIntList(b []byte, n int, vals []int, comma bool) []byte {
	for i, v := range vals {
		if uint(v) >= 1e6 { // negative, or past any vocabulary: strconv's
			if i > 0 || comma {
				b[n] = ','
				n++
			}
			out := strconv.AppendInt(b[:n], int64(v), 10)
			b, n = reserve(out, IntListRoom(len(vals)-i-1))
			continue
		}
		hi, lo := uint32(v)/10000, uint32(v)%10000 // hi < 100
		x := uint64(digitPairs[hi]) | uint64(quads[lo])<<16
		d := max(highDigits[hi], quadDigits[lo])                  // the number of digits
		binary.LittleEndian.PutUint64(b[n:], x>>(8*(6-d))<<8|',') // a comma, the d digits, then zeros the next value overwrites
		n += int(d) + 1
		if i == 0 && !comma { // the first of a list: no comma
			copy(b[n-int(d)-1:], b[n-int(d):n])
			n--
		}
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

// digitPairs[i] is the two ASCII digits of i (00 to 99), the first in the low byte; highDigits[i]
// the digits of a number i*10^4 + lo, lo < 10^4, has (0 for i = 0: lo's own).
var digitPairs, highDigits = func() (t [100]uint16, d [100]uint8) {
	for i := range t {
		t[i] = uint16('0'+i/10) | uint16('0'+i%10)<<8
		d[i] = uint8(min(i, 1)*5 + min(i/10, 1))
	}
	return t, d
}()

// quads[i] is the four ASCII digits of i (0000 to 9999), the first in the low byte; quadDigits[i]
// the digits of i written without leading zeros (1 for 0).
var quads, quadDigits = func() (t [10000]uint32, d [10000]uint8) {
	for i := range t {
		t[i] = uint32(digitPairs[i/100]) | uint32(digitPairs[i%100])<<16
		d[i] = uint8(len(strconv.Itoa(i)))
	}
	return t, d
}()
