package body

import "encoding/binary"

// maxDepth matches encoding/json's nesting limit.
const maxDepth = 10000

// Valid reports whether data is one valid JSON value, with exactly encoding/json.Valid's verdict
// (FuzzValid checks the two agree). It is several times faster on the bodies a coordinator sees,
// which are dominated by long strings (base64 images, prompts): string contents are scanned eight
// bytes at a time for the only bytes that matter there (quote, backslash, control characters).
func Valid(data []byte) bool {
	v := validator{data: data}
	v.space()
	if !v.value(0) {
		return false
	}
	v.space()
	return v.pos == len(v.data)
}

type validator struct {
	data []byte
	pos  int
}

func (v *validator) space() {
	for v.pos < len(v.data) {
		switch v.data[v.pos] {
		case ' ', '\t', '\n', '\r':
			v.pos++
		default:
			return
		}
	}
}

func (v *validator) value(depth int) bool {
	if v.pos >= len(v.data) {
		return false
	}
	switch c := v.data[v.pos]; {
	case c == '"':
		return v.str()
	case c == '{':
		return v.object(depth + 1)
	case c == '[':
		return v.array(depth + 1)
	case c == 't':
		return v.literal("true")
	case c == 'f':
		return v.literal("false")
	case c == 'n':
		return v.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return v.number()
	}
	return false
}

func (v *validator) literal(lit string) bool {
	if len(v.data)-v.pos < len(lit) || string(v.data[v.pos:v.pos+len(lit)]) != lit {
		return false
	}
	v.pos += len(lit)
	return true
}

func (v *validator) object(depth int) bool {
	if depth > maxDepth {
		return false
	}
	v.pos++ // {
	v.space()
	if v.pos < len(v.data) && v.data[v.pos] == '}' {
		v.pos++
		return true
	}
	for {
		if v.pos >= len(v.data) || v.data[v.pos] != '"' || !v.str() {
			return false
		}
		v.space()
		if v.pos >= len(v.data) || v.data[v.pos] != ':' {
			return false
		}
		v.pos++
		v.space()
		if !v.value(depth) {
			return false
		}
		if more, ok := v.after('}'); !more {
			return ok
		}
	}
}

// after reads what follows a container's member or element: a comma (more follow) or the
// container's close (ok, no more); anything else is invalid.
func (v *validator) after(closing byte) (more, ok bool) {
	v.space()
	if v.pos >= len(v.data) {
		return false, false
	}
	switch v.data[v.pos] {
	case ',':
		v.pos++
		v.space()
		return true, true
	case closing:
		v.pos++
		return false, true
	}
	return false, false
}

func (v *validator) array(depth int) bool {
	if depth > maxDepth {
		return false
	}
	v.pos++ // [
	v.space()
	if v.pos < len(v.data) && v.data[v.pos] == ']' {
		v.pos++
		return true
	}
	for {
		if !v.value(depth) {
			return false
		}
		if more, ok := v.after(']'); !more {
			return ok
		}
	}
}

// SWAR constants: a byte-wise broadcast of 0x01 and 0x80.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// specialMask has a high bit set (possibly with false positives above a true hit) for every
// byte of the word that is a quote, a backslash or below 0x20.
func specialMask(x uint64) uint64 {
	q := x ^ (lsb * '"')
	b := x ^ (lsb * '\\')
	return ((q - lsb) &^ q) | ((b - lsb) &^ b) | ((x - lsb*0x20) &^ x)
}

// special reports whether any byte of the word may need attention (see specialMask).
func special(x uint64) bool { return specialMask(x)&msb != 0 }

// wordRounds is how many 32-byte rounds of words a string is scanned in before the vector scan.
const wordRounds = 4

func (v *validator) str() bool {
	v.pos++ // opening quote
	d := v.data
	for {
		v.pos += plainRun(d[v.pos:])
		if v.pos >= len(d) {
			return false
		}
		switch c := d[v.pos]; c {
		case '"':
			v.pos++
			return true
		case '\\':
			if !v.escape() {
				return false
			}
		default:
			return false // a control byte
		}
	}
}

// plainRun returns how many leading bytes of d are plain string content: no quote, backslash or
// control byte. It checks 32 bytes per round of words while nothing special shows up, then 8,
// then byte by byte. A run still plain after wordRounds rounds is a long one (base64 media): it
// is crossed in 32-byte vector blocks where the CPU has them. Short runs (keys, most values, the
// text between two escapes) never reach the vectors, whose fixed cost per call is high on some
// CPUs (a microsecond and more on virtualised Xeons: 13x the word loop on a 200-byte answer).
func plainRun(d []byte) int {
	pos := 0
	for rounds := 0; pos+32 <= len(d); rounds++ {
		if rounds == wordRounds {
			if pos += skipPlain(d[pos:]); pos+32 > len(d) {
				break
			}
		}
		w := d[pos : pos+32 : pos+32]
		m := specialMask(binary.LittleEndian.Uint64(w)) | specialMask(binary.LittleEndian.Uint64(w[8:])) |
			specialMask(binary.LittleEndian.Uint64(w[16:])) | specialMask(binary.LittleEndian.Uint64(w[24:]))
		if m&msb != 0 {
			break
		}
		pos += 32
	}
	for pos+8 <= len(d) && !special(binary.LittleEndian.Uint64(d[pos:])) {
		pos += 8
	}
	for ; pos < len(d); pos++ {
		if c := d[pos]; c == '"' || c == '\\' || c < 0x20 {
			return pos
		}
	}
	return pos
}

func (v *validator) escape() bool {
	d := v.data
	if v.pos+1 >= len(d) {
		return false
	}
	switch d[v.pos+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		v.pos += 2
		return true
	case 'u':
		if v.pos+6 > len(d) {
			return false
		}
		for _, h := range d[v.pos+2 : v.pos+6] {
			if !(h >= '0' && h <= '9' || h >= 'a' && h <= 'f' || h >= 'A' && h <= 'F') {
				return false
			}
		}
		v.pos += 6
		return true
	}
	return false
}

func (v *validator) number() bool {
	i, ok := numberEnd(v.data, v.pos)
	v.pos = i
	return ok
}

// numberEnd reads the number at d[i:] and returns where it ends and whether it is one. The
// position is a local, not the validator's field: a prefill answer's block ids are thousands of
// numbers, and the field's loads and stores were most of their cost.
func numberEnd(d []byte, i int) (int, bool) {
	if d[i] == '-' {
		i++
	}
	if i >= len(d) {
		return i, false
	}
	switch c := d[i]; {
	case c == '0':
		i++
	case c-'1' < 9:
		for i++; i < len(d) && d[i]-'0' < 10; i++ {
		}
	default:
		return i, false
	}
	if i < len(d) && d[i] == '.' {
		i++
		j := i
		for i < len(d) && d[i]-'0' < 10 {
			i++
		}
		if i == j {
			return i, false
		}
	}
	if i < len(d) && d[i]|0x20 == 'e' {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := i
		for i < len(d) && d[i]-'0' < 10 {
			i++
		}
		if i == j {
			return i, false
		}
	}
	return i, true
}
