//go:build !amd64

package body

// skipPlain has no vector form on this architecture: the validator's word loop does the work.
func skipPlain([]byte) int { return 0 }
