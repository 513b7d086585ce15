package body

import (
	"bytes"
	"testing"
)

// TestSkipPlainMatchesTheWordLoop checks the vector scan against the definition at every position
// of every special byte, and the validator with and without it.
func TestSkipPlainMatchesTheWordLoop(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2 on this CPU: the word loop is the only path")
	}
	plainPrefix := func(b []byte) int {
		n := 0
		for n+32 <= len(b) {
			for _, c := range b[n : n+32] {
				if c == '"' || c == '\\' || c < 0x20 {
					return n
				}
			}
			n += 32
		}
		return n
	}
	for _, special := range []byte{'"', '\\', 0x00, 0x1f, '\n'} {
		for n := 0; n < 200; n++ {
			b := bytes.Repeat([]byte{'A'}, 200)
			b[n] = special
			if got, want := skipPlainAVX2(b), plainPrefix(b); got != want {
				t.Fatalf("special %#x at %d: %d, want %d", special, n, got, want)
			}
		}
	}
	for _, c := range []byte{0x20, 0x7f, 0x80, 0xff, '!', '#', '[', ']'} { // not special
		b := bytes.Repeat([]byte{c}, 100)
		if skipPlainAVX2(b) != 96 {
			t.Fatalf("byte %#x stopped the scan", c)
		}
	}
	defer func() { hasAVX2 = true }()
	hasAVX2 = false
	TestValidLongStrings(t)
	TestValidAgreesWithEncodingJSON(t)
}
