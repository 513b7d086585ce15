package media

import "golang.org/x/sys/cpu"

// skipQuietAVX2 returns the length of the longest prefix of b, in whole 32-byte blocks, with no
// colon and no backslash (scan_amd64.s). It needs AVX2 (hasAVX2).
//
//go:noescape
func skipQuietAVX2(b []byte) int

var hasAVX2 = cpu.X86.HasAVX2
