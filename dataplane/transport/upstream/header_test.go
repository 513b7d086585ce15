package upstream

import (
	"net/http"
	"reflect"
	"testing"
)

func TestForwarded(t *testing.T) {
	tests := map[string]struct {
		in, want http.Header
		owned    []string
	}{
		"end-to-end headers kept with every value": {
			in:   http.Header{"Authorization": {"Bearer x"}, "X-Tenant": {"a", "b"}},
			want: http.Header{"Authorization": {"Bearer x"}, "X-Tenant": {"a", "b"}},
		},
		"hop-by-hop dropped": {
			in: http.Header{"Connection": {"keep-alive"}, "Keep-Alive": {"timeout=5"}, "Te": {"trailers"}, "Trailer": {"X"},
				"Transfer-Encoding": {"chunked"}, "Upgrade": {"h2c"}, "Proxy-Authorization": {"p"}, "Proxy-Connection": {"close"}, "Accept": {"*/*"}},
			want: http.Header{"Accept": {"*/*"}},
		},
		"headers named in Connection dropped, every token of every value": {
			in:   http.Header{"Connection": {"X-A, x-b", " X-C "}, "X-A": {"1"}, "X-B": {"2"}, "X-C": {"3"}, "X-D": {"4"}},
			want: http.Header{"X-D": {"4"}},
		},
		"coordinator-owned dropped": {
			in: http.Header{"Host": {"h"}, "Content-Length": {"3"}, "Content-Type": {"text/plain"}, "Accept-Encoding": {"gzip"},
				"X-Request-Id": {"spoofed"}, "X-Keep": {"k"}},
			want: http.Header{"X-Keep": {"k"}},
		},
		"caller-owned dropped": {
			in:    http.Header{"Epp-Profile": {"prefill"}, "Prefer": {"if-available"}, "X-Keep": {"k"}},
			owned: []string{"Epp-Profile", "Prefer"},
			want:  http.Header{"X-Keep": {"k"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := tc.in.Clone()
			got := Forwarded(tc.in, tc.owned)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Forwarded = %v, want %v", got, tc.want)
			}
			if !reflect.DeepEqual(tc.in, in) {
				t.Fatalf("the client's header changed: %v", tc.in)
			}
		})
	}
}

func TestCopyResponseHeader(t *testing.T) {
	src := http.Header{"Content-Type": {"text/event-stream"}, "Set-Cookie": {"a=1", "b=2"}, "Connection": {"x-hop, keep-alive, retry-after"},
		"X-Hop": {"1"}, "Transfer-Encoding": {"chunked"}, "Keep-Alive": {"timeout=5"}, "Server": {"envoy"},
		"X-Envoy-Upstream-Service-Time": {"3"}, "Retry-After": {"1"}, "X-Ratelimit-Remaining-Tokens": {"99"},
		"Openai-Model": {"m"}, "X-Disagg-Revision": {"r1"}, "X-Pod": {"decode-0"}}
	// The coordinator's own Connection: close (a connection the framing guard closes) survives
	// the copy: the worker's hop-by-hop headers are skipped, not deleted from the response.
	tests := map[string]struct {
		named []string
		want  http.Header
	}{
		"the allow list": {want: http.Header{"X-Request-Id": {"id"}, "Connection": {"close"}, "Content-Type": {"text/event-stream"},
			"X-Ratelimit-Remaining-Tokens": {"99"}, "Openai-Model": {"m"}}},
		"and the forwarded names": {named: []string{"X-Disagg-Revision"}, want: http.Header{"X-Request-Id": {"id"}, "Connection": {"close"},
			"Content-Type": {"text/event-stream"}, "X-Ratelimit-Remaining-Tokens": {"99"}, "Openai-Model": {"m"}, "X-Disagg-Revision": {"r1"}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			dst := http.Header{"X-Request-Id": {"id"}, "Connection": {"close"}}
			CopyResponseHeader(dst, src, tc.named)
			if !reflect.DeepEqual(dst, tc.want) {
				t.Fatalf("copied %v, want %v", dst, tc.want)
			}
		})
	}
}
