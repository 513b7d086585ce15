package gateway

import (
	"errors"
	"net/http"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/request"
)

func TestReadHints(t *testing.T) {
	many := strings.Repeat("10.0.0.1:80,", 20) + "10.0.0.1:80"
	tests := map[string]struct {
		header  http.Header
		allowed []netip.Prefix
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
		// The metadata service, loopback and link-local are no pod's: a picker (or a worker
		// answering the 412) naming them is not followed.
		"refused addresses dropped": {
			header: http.Header{
				"X-Prefill-Host-Port": {"169.254.169.254:8000, 127.0.0.1:8000, [::1]:8000, [::ffff:127.0.0.1]:8000, [fe80::1]:8000, 10.0.0.2:8000"},
				"X-Encode-Host-Port":  {"169.254.169.254:80"},
			},
			want:    map[string][]string{"prefill": {"10.0.0.2:8000"}},
			dropped: 6,
		},
		"loopback in the allow list": {
			header:  http.Header{"X-Prefill-Host-Port": {"127.0.0.1:8000,[::ffff:127.0.0.2]:8001,169.254.169.254:8000,[::1]:8000"}},
			allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
			want:    map[string][]string{"prefill": {"127.0.0.1:8000", "127.0.0.2:8001"}},
			dropped: 2,
		},
		"at most 16":           {header: http.Header{"X-Prefill-Host-Port": {many}}, want: map[string][]string{"prefill": strings.Split(many, ",")[:16]}, dropped: 5},
		"too long":             {header: http.Header{"X-Encode-Host-Port": {strings.Repeat("1", 2000)}}, dropped: 1},
		"decode is not hinted": {header: http.Header{"X-Decode-Host-Port": {"10.0.0.1:80"}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, dropped := ReadHints(tc.header, tc.allowed)
			if !reflect.DeepEqual(got, tc.want) || dropped != tc.dropped {
				t.Fatalf("ReadHints = %v (%d dropped), want %v (%d)", got, dropped, tc.want, tc.dropped)
			}
		})
	}
}

// EndpointOf accepts the unicast addresses pods have, private ones included, and refuses the
// rest, naming why; gateway.allowed_hint_networks admits loopback and link-local networks only.
func TestEndpointOf(t *testing.T) {
	loopback := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	linkLocal := []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fe80::/10")}
	everything := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	tests := []struct {
		in      string
		allowed []netip.Prefix
		want    string // the endpoint returned, "" when refused
		reason  string // the refusal's reason, "" for ErrNotEndpoint
	}{
		{in: "127.0.0.1:8000", reason: "a loopback address"},
		{in: "127.1.2.3:8000", reason: "a loopback address"},
		{in: "[::1]:8000", reason: "a loopback address"},
		{in: "[::ffff:127.0.0.1]:8000", reason: "a loopback address (IPv4-mapped 127.0.0.1)"},
		{in: "169.254.169.254:8000", reason: "a link-local address"},
		{in: "[::ffff:169.254.169.254]:80", reason: "a link-local address (IPv4-mapped 169.254.169.254)"},
		{in: "[fe80::1]:8000", reason: "a link-local address"},
		{in: "0.0.0.0:8000", reason: "an unspecified address"},
		{in: "[::]:8000", reason: "an unspecified address"},
		{in: "[::ffff:0.0.0.0]:8000", reason: "an unspecified address (IPv4-mapped 0.0.0.0)"},
		{in: "0.1.2.3:8000", reason: "an address of 0.0.0.0/8 (this host)"},
		{in: "255.255.255.255:8000", reason: "the broadcast address"},
		{in: "224.0.0.1:8000", reason: "a link-local multicast address"},
		{in: "239.1.2.3:8000", reason: "a multicast address"},
		{in: "[ff02::1]:8000", reason: "a link-local multicast address"},
		{in: "[ff05::2]:8000", reason: "a multicast address"},
		{in: "10.0.0.5:8000", want: "10.0.0.5:8000"},
		{in: "192.168.1.2:8000", want: "192.168.1.2:8000"},
		{in: "172.16.0.9:8000", want: "172.16.0.9:8000"},
		{in: "100.64.0.1:8000", want: "100.64.0.1:8000"},
		{in: "[fd00::1]:8000", want: "[fd00::1]:8000"},
		{in: "[2001:db8::1]:8000", want: "[2001:db8::1]:8000"},
		{in: "[::ffff:10.0.0.5]:8000", want: "10.0.0.5:8000"},
		{in: "8.8.8.8:53", want: "8.8.8.8:53"},
		// The allow list admits loopback and link-local addresses in it, nothing else.
		{in: "127.0.0.1:8000", allowed: loopback, want: "127.0.0.1:8000"},
		{in: "[::1]:8000", allowed: loopback, want: "[::1]:8000"},
		{in: "[::ffff:127.0.0.1]:8000", allowed: loopback, want: "127.0.0.1:8000"},
		{in: "169.254.169.254:8000", allowed: loopback, reason: "a link-local address"},
		{in: "169.254.169.254:8000", allowed: linkLocal, want: "169.254.169.254:8000"},
		{in: "[fe80::1]:8000", allowed: linkLocal, want: "[fe80::1]:8000"},
		{in: "127.0.0.1:8000", allowed: linkLocal, reason: "a loopback address"},
		{in: "0.0.0.0:8000", allowed: everything, reason: "an unspecified address"},
		{in: "[::]:8000", allowed: everything, reason: "an unspecified address"},
		{in: "224.0.0.1:8000", allowed: everything, reason: "a link-local multicast address"},
		{in: "[ff02::1]:8000", allowed: everything, reason: "a link-local multicast address"},
		{in: "255.255.255.255:8000", allowed: everything, reason: "the broadcast address"},
		{in: "10.0.0.5:8000", allowed: loopback, want: "10.0.0.5:8000"},
		// Not an ip:port at all.
		{in: "prefill-0:8000"},
		{in: "localhost:8000"},
		{in: "10.0.0.5"},
		{in: "10.0.0.5:0"},
		{in: "[fe80::1%eth0]:8000", allowed: everything},
		{in: "http://10.0.0.5:8000"},
		{in: ""},
	}
	for _, tc := range tests {
		got, err := EndpointOf(tc.in, tc.allowed)
		var refused *RefusedAddressError
		switch {
		case tc.want != "":
			if err != nil || got.String() != tc.want {
				t.Errorf("EndpointOf(%q, %v) = %v, %v; want %s", tc.in, tc.allowed, got, err, tc.want)
			}
		case tc.reason != "":
			if !errors.As(err, &refused) || refused.Reason != tc.reason || refused.Endpoint.String() != strings.Trim(tc.in, " ") || got.IsValid() {
				t.Errorf("EndpointOf(%q, %v) = %v, %v; want it refused as %s", tc.in, tc.allowed, got, err, tc.reason)
			}
		default:
			if !errors.Is(err, ErrNotEndpoint) || got.IsValid() {
				t.Errorf("EndpointOf(%q, %v) = %v, %v; want %v", tc.in, tc.allowed, got, err, ErrNotEndpoint)
			}
		}
	}
	_, err := EndpointOf("169.254.169.254:8000", nil)
	if err == nil || err.Error() != "169.254.169.254:8000 is a link-local address" {
		t.Fatalf("error %v", err)
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
