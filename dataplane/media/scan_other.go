//go:build !amd64

package media

// hasAVX2 is false off amd64: mayNameURL uses bytes.Contains.
const hasAVX2 = false

// skipQuietAVX2 is never called off amd64.
func skipQuietAVX2([]byte) int { panic("media: no vector scan on this architecture") }
