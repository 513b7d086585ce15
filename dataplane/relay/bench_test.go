package relay

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// A 16-token chat stream, one event per read as a worker flushes them: the resumable relay
// against the plain one.
func BenchmarkStreamRelay(b *testing.B) {
	events := []string{role}
	for i := range 16 {
		events = append(events, chunk("chatcmpl-x", strings.Repeat("w", i%5+2)))
	}
	events = append(events, "data: [DONE]\n\n")
	for _, tc := range []struct {
		name  string
		relay func(w http.ResponseWriter, resp *http.Response) error
	}{
		{"relay.Stream", func(w http.ResponseWriter, resp *http.Response) error {
			s := New(w, "rid", wire.Chat, Limits{}, nil)
			defer s.Release()
			return s.Relay(resp)
		}},
		{"upstream.Relay", func(w http.ResponseWriter, resp *http.Response) error {
			return upstream.Relay(w, resp, "rid", true, nil)
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				if err := tc.relay(rec, eventStream(io.EOF, events...)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
