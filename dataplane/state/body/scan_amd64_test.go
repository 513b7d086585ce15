package body

import (
	"bytes"
	"encoding/json"
	"testing"
)

// plainPrefix is skipPlainAVX2's definition in Go: the longest prefix, in whole 32-byte blocks,
// without a quote, a backslash or a control byte.
func plainPrefix(b []byte) int {
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

// TestSkipPlainMatchesTheWordLoop checks the vector scan against the definition at every position
// of every special byte, and the validator with and without it.
func TestSkipPlainMatchesTheWordLoop(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2 on this CPU: the word loop is the only path")
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

// FuzzSkipPlain is a differential fuzz of the assembly scanner against its definition, at every
// alignment, and of the validator with the vector scan against the validator with the word loop
// alone (the path of CPUs without AVX2 and of other architectures) and encoding/json.
func FuzzSkipPlain(f *testing.F) {
	for _, s := range []string{
		`"` + string(bytes.Repeat([]byte("A"), 70)) + `"`,
		`{"k":"` + string(bytes.Repeat([]byte("é"), 40)) + `\"` + string(bytes.Repeat([]byte("b"), 40)) + `"}`,
		"[\"" + string(bytes.Repeat([]byte{0x7f, 0x80, 0xff, ' '}, 20)) + "\x1f\"]",
		`"` + string(bytes.Repeat([]byte("x"), 31)) + `\\` + string(bytes.Repeat([]byte("y"), 64)) + `"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if hasAVX2 {
			for off := 0; off < len(data) && off < 64; off++ {
				if got, want := skipPlainAVX2(data[off:]), plainPrefix(data[off:]); got != want {
					t.Fatalf("skipPlainAVX2(%q) = %d, want %d", data[off:], got, want)
				}
			}
		}
		vector := Valid(data)
		defer func(saved bool) { hasAVX2 = saved }(hasAVX2)
		hasAVX2 = false
		if words, std := Valid(data), json.Valid(data); vector != words || words != std {
			t.Fatalf("Valid(%q): %v with AVX2, %v without, encoding/json %v", data, vector, words, std)
		}
	})
}
