package tokenizer

import (
	"sync"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Most text is already normalized, and a normalizer's first job is to say so quickly. A string
// is in a normalization form when each of its characters has the form's quick check Yes and
// canonical combining class 0 (Unicode's quick check answers Yes, which is never wrong): such a
// character neither reorders nor composes with a neighbour. quickSafe marks those characters,
// per form, for the first two planes (where nearly all text and emoji are); isNormal scans
// ASCII eight bytes at a time and looks everything else up. It only ever answers "yes" or
// "don't know": x/text decides the rest.

// quickSafe is a bitset of the characters below quickLimit that are safe in one form.
type quickSafe [quickLimit / 64]uint64

const quickLimit = 0x20000

var quickTables [4]func() *quickSafe // by norm.Form, 16 KiB each, built on first use (~10 ms)

func init() {
	for f := range quickTables {
		quickTables[f] = sync.OnceValue(func() *quickSafe {
			t := new(quickSafe)
			for r := rune(0); r < quickLimit; r++ {
				if utf8.ValidRune(r) && safeIn(norm.Form(f), string(r)) {
					t[r>>6] |= 1 << (r & 63)
				}
			}
			return t
		})
	}
}

// safeIn reports whether the character c (its UTF-8 bytes) has quick check Yes and combining
// class 0 in form f.
func safeIn(f norm.Form, c string) bool {
	p := f.PropertiesString(c)
	// BoundaryBefore is false for quick check Maybe (composes with what precedes); a lone
	// character spans itself exactly when its quick check is Yes.
	return p.CCC() == 0 && p.BoundaryBefore() && f.QuickSpanString(c) == len(c)
}

// isNormal reports whether s is valid UTF-8 and certainly in form f (t is f's table): false
// means that it is invalid, or not normalized, or unknown.
func isNormal(f norm.Form, t *quickSafe, s string) bool {
	for i := 0; i < len(s); {
		for i+8 <= len(s) && le64s(s[i:])&0x8080808080808080 == 0 {
			i += 8
		}
		if i == len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			i++
			continue
		}
		// The 3-byte sequences (CJK and most other scripts) inline, anything else decoded.
		if i+2 < len(s) {
			if r, ok := decode3(c, s[i+1], s[i+2]); ok {
				if t[r>>6]&(1<<(r&63)) == 0 {
					return false
				}
				i += 3
				continue
			}
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			return false
		case r < quickLimit:
			if t[r>>6]&(1<<(r&63)) == 0 {
				return false
			}
		case !safeIn(f, s[i:i+n]):
			return false
		}
		i += n
	}
	return true
}
