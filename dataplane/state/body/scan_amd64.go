package body

import "golang.org/x/sys/cpu"

// skipPlainAVX2 returns the length of the longest prefix of b, in whole 32-byte blocks, with no
// quote, backslash or control byte (scan_amd64.s).
//
//go:noescape
func skipPlainAVX2(b []byte) int

var hasAVX2 = cpu.X86.HasAVX2

// skipPlain returns how many leading bytes of b (a multiple of 32, possibly 0) are plain string
// content. It lets the validator cross base64 images at SIMD speed.
func skipPlain(b []byte) int {
	if !hasAVX2 || len(b) < 32 {
		return 0
	}
	return skipPlainAVX2(b)
}
