package gateway

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/request"
)

func TestReadHints(t *testing.T) {
	many := strings.Repeat("10.0.0.1:80,", 20) + "10.0.0.1:80"
	tests := map[string]struct {
		header  http.Header
		want    map[string][]string
		dropped int
	}{
		"none": {header: http.Header{}},
		"RFC 2178 names": {
			header: http.Header{"X-Prefill-Host-Port": {"10.0.0.1:8000,10.0.0.2:8000"}, "X-Encode-Host-Port": {"10.0.1.1:8000"}},
			want:   map[string][]string{"prefill": {"10.0.0.1:8000", "10.0.0.2:8000"}, "encode": {"10.0.1.1:8000"}},
		},
		"llm-d disaggregation names": {
			header: http.Header{"X-Llm-D-Prefiller-Host-Port": {"10.0.0.3:8000"}, "X-Encoder-Hosts-Ports": {"10.0.1.2:8000, 10.0.1.3:8000"}},
			want:   map[string][]string{"prefill": {"10.0.0.3:8000"}, "encode": {"10.0.1.2:8000", "10.0.1.3:8000"}},
		},
		"the RFC name wins": {
			header: http.Header{"X-Prefill-Host-Port": {"10.0.0.1:1"}, "X-Prefiller-Host-Port": {"10.0.0.9:9"}},
			want:   map[string][]string{"prefill": {"10.0.0.1:1"}},
		},
		"ipv6": {header: http.Header{"X-Prefill-Host-Port": {"[fd00::1]:8000"}}, want: map[string][]string{"prefill": {"[fd00::1]:8000"}}},
		"bad items dropped": {
			header:  http.Header{"X-Prefill-Host-Port": {"prefill-0:8000,10.0.0.1,10.0.0.1:0,,10.0.0.2:8000,http://10.0.0.3:1,0.0.0.0:80,[fe80::1%eth0]:80,224.0.0.1:80"}},
			want:    map[string][]string{"prefill": {"10.0.0.2:8000"}},
			dropped: 8,
		},
		"at most 16":           {header: http.Header{"X-Prefill-Host-Port": {many}}, want: map[string][]string{"prefill": strings.Split(many, ",")[:16]}, dropped: 5},
		"too long":             {header: http.Header{"X-Encode-Host-Port": {strings.Repeat("1", 2000)}}, dropped: 1},
		"decode is not hinted": {header: http.Header{"X-Decode-Host-Port": {"10.0.0.1:80"}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, dropped := ReadHints(tc.header)
			if !reflect.DeepEqual(got, tc.want) || dropped != tc.dropped {
				t.Fatalf("ReadHints = %v (%d dropped), want %v (%d)", got, dropped, tc.want, tc.dropped)
			}
		})
	}
}

// The first attempt goes to the hint (item i to hint i modulo their number), the rest wherever
// the picker chooses.
func TestHinted(t *testing.T) {
	rc := &request.Context{Hints: map[string][]string{"encode": {"10.0.0.1:1", "10.0.0.2:2"}}}
	base := func() (Leg, error) { return Leg{}, nil }
	for i, want := range []string{"10.0.0.1:1", "10.0.0.2:2", "10.0.0.1:1"} {
		build := Hinted(rc, "encode", i, base)
		first, _ := build()
		again, _ := build()
		if first.Header.Get(PinHeader) != want || again.Header.Get(PinHeader) != "" {
			t.Fatalf("item %d: first %v, retry %v", i, first.Header, again.Header)
		}
	}
	if leg, _ := Hinted(rc, "prefill", 0, base)(); leg.Header != nil {
		t.Fatalf("prefill leg without hints carries %v", leg.Header)
	}
	failing := func() (Leg, error) { return Leg{}, errors.New("no body") }
	if _, err := Hinted(rc, "encode", 0, failing)(); err == nil {
		t.Fatal("the build's error was lost")
	}
}
