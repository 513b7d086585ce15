package conn

import (
	"strings"
	"testing"

	"github.com/google/uuid"
)

// Fuzz targets of what the server parses from a client; their seed corpora are in
// testdata/fuzz/<target>/ and run with every go test (make fuzz explores further).

// keptRequestID is the rule RequestID implements, written out byte by byte.
func keptRequestID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// FuzzRequestID: the id is always safe to echo in headers and logs (≤ 128 characters of
// [A-Za-z0-9-]), and a client's id is kept exactly when it is one.
func FuzzRequestID(f *testing.F) {
	for _, s := range []string{"", "abc-DEF-123", strings.Repeat("a", 128), strings.Repeat("a", 129), "x\"; drop", "a_b",
		"id\r\nX-Injected: 1", "é", "0", "-", "abc\n", "abc\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, client string) {
		id, replaced := RequestID(client)
		if !keptRequestID(id) {
			t.Fatalf("RequestID(%q) = %q: not a valid id", client, id)
		}
		if keptRequestID(client) {
			if id != client || replaced {
				t.Fatalf("RequestID(%q) = %q, %v: a valid id must be kept", client, id, replaced)
			}
			return
		}
		if u, err := uuid.Parse(id); err != nil || u.Version() != 4 || len(id) != 36 {
			t.Fatalf("RequestID(%q) = %q: not a generated UUIDv4", client, id)
		}
		if replaced != (client != "") {
			t.Fatalf("RequestID(%q): replaced = %v", client, replaced)
		}
	})
}
