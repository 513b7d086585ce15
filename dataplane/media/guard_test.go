package media

import (
	"errors"
	"net/netip"
	"net/url"
	"strings"
	"testing"
)

// TestNetGuardAddresses holds the guard to the IANA special-purpose registries (IPv4 and IPv6)
// and to what an SSRF must never reach.
func TestNetGuardAddresses(t *testing.T) {
	plain := newNetGuard(nil, []uint16{80, 443}, nil, nil)
	private := newNetGuard(privateRanges, []uint16{80, 443}, nil, nil)
	cache := newNetGuard([]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("fd00:ec2::/32")}, []uint16{80}, nil, nil)
	tests := []struct {
		addr string
		// allowed by the default guard, with allow_private_networks, with allowed_networks
		// [127.0.0.1/32, fd00:ec2::/32].
		plain, private, cache bool
	}{
		{"8.8.8.8", true, true, true},
		{"2001:4860:4860::8888", true, true, true},
		{"::ffff:8.8.8.8", true, true, true}, // mapped: judged as IPv4
		{"0.0.0.0", false, false, false},
		{"0.1.2.3", false, false, false},              // "this network"
		{"127.0.0.1", false, false, true},             // loopback
		{"127.0.0.2", false, false, false},            // loopback outside the allowed /32
		{"::ffff:127.0.0.1", false, false, true},      // mapped loopback
		{"10.0.0.1", false, true, false},              // RFC 1918
		{"172.16.0.1", false, true, false},            // RFC 1918
		{"192.168.0.1", false, true, false},           // RFC 1918
		{"::ffff:10.0.0.1", false, true, false},       // mapped RFC 1918
		{"169.254.169.254", false, false, false},      // link-local: cloud metadata
		{"100.64.0.1", false, false, false},           // CGNAT
		{"192.0.0.1", false, false, false},            // IETF protocol assignments
		{"192.0.2.1", false, false, false},            // TEST-NET-1
		{"198.51.100.1", false, false, false},         // TEST-NET-2
		{"203.0.113.1", false, false, false},          // TEST-NET-3
		{"198.18.0.1", false, false, false},           // benchmarking
		{"192.88.99.1", false, false, false},          // 6to4 relay anycast
		{"224.0.0.1", false, false, false},            // multicast
		{"240.0.0.1", false, false, false},            // reserved
		{"255.255.255.255", false, false, false},      // broadcast
		{"::", false, false, false},                   // unspecified
		{"::1", false, false, false},                  // loopback
		{"fe80::1", false, false, false},              // link-local
		{"fe80::1%lo", false, false, false},           // zoned
		{"2001:4860::8888%eth0", false, false, false}, // zoned, even when global
		{"fd00::1", false, false, false},              // unique local
		{"fd00:ec2::254", false, false, true},         // AWS IPv6 metadata (unique local)
		{"ff02::1", false, false, false},              // multicast
		{"64:ff9b::a9fe:a9fe", false, false, false},   // NAT64 of 169.254.169.254
		{"64:ff9b::7f00:1", false, false, false},      // NAT64 of 127.0.0.1
		{"64:ff9b:1::1", false, false, false},         // local-use NAT64
		{"2002:a9fe:a9fe::1", false, false, false},    // 6to4 of 169.254.169.254
		{"2001::1", false, false, false},              // Teredo
		{"2001:db8::1", false, false, false},          // documentation
		{"3fff::1", false, false, false},              // documentation
		{"100::1", false, false, false},               // discard-only
	}
	for _, tt := range tests {
		a := netip.MustParseAddr(tt.addr)
		for _, g := range []struct {
			name  string
			guard *netGuard
			want  bool
		}{{"default", plain, tt.plain}, {"allow_private_networks", private, tt.private}, {"allowed_networks", cache, tt.cache}} {
			if err := g.guard.checkAddr(a); (err == nil) != g.want {
				t.Errorf("%s, %s: err = %v, want allowed=%v", tt.addr, g.name, err, g.want)
			}
		}
	}
}

func TestNetGuardURLs(t *testing.T) {
	g := newNetGuard(nil, []uint16{80, 443}, []string{"example.com"}, nil)
	exempt := newNetGuard(nil, []uint16{80, 443}, nil, netip.Addr.IsLoopback)
	tests := []struct {
		guard  *netGuard
		url    string
		reason string // "" when allowed
	}{
		{g, "https://img.example.com/a.png", ""},
		{g, "http://EXAMPLE.com./a.png", ""},
		{g, "http://example.com:443/a.png", ""},
		{g, "http://badexample.com/a.png", reasonDomain},
		{g, "ftp://example.com/a.png", reasonScheme},
		{g, "http:///a.png", reasonNoHost},
		{g, "http://example.com:8080/a.png", "port 8080 is not allowed"},
		{g, "https://example.com:0/a.png", "port 0 is not allowed"},
		{g, "http://example.com:99999/a.png", "port 99999 is not allowed"},
		{g, "http://10.0.0.1/a.png", reasonNonPublic},
		{g, "http://[fe80::1%25lo]/a.png", reasonNonPublic},
		{g, "http://[64:ff9b::a9fe:a9fe]/", reasonNonPublic},
		{g, "http://[::ffff:169.254.169.254]/", reasonNonPublic},
		{exempt, "http://127.0.0.1:12345/a.png", ""}, // the test override: any port
		{exempt, "http://localhost:12345/a.png", "port 12345 is not allowed"},
		{exempt, "http://8.8.8.8:12345/a.png", "port 12345 is not allowed"},
	}
	for _, tt := range tests {
		u, err := url.Parse(tt.url)
		if err != nil {
			t.Fatal(err)
		}
		r := tt.guard.checkURL(u)
		if tt.reason == "" && r != nil || tt.reason != "" && (r == nil || r.reason != tt.reason) {
			t.Errorf("%s: refusal = %v, want reason %q", tt.url, r, tt.reason)
		}
	}
}

func TestNetGuardControl(t *testing.T) {
	g := newNetGuard(nil, []uint16{443}, nil, nil)
	tests := []struct {
		network, address, reason string
	}{
		{"tcp4", "8.8.8.8:443", ""},
		{"tcp6", "[2001:4860:4860::8888]:443", ""},
		{"tcp4", "8.8.8.8:80", "port 80 is not allowed"},
		{"tcp4", "127.0.0.1:443", reasonResolves},
		{"tcp6", "[::ffff:169.254.169.254]:443", reasonResolves},
		{"tcp6", "[fe80::1%lo]:443", reasonResolves},
		{"udp4", "8.8.8.8:443", reasonResolves},
		{"tcp4", "not an address", reasonResolves},
	}
	for _, tt := range tests {
		err := g.control(tt.network, tt.address, nil)
		var r *refusal
		if tt.reason == "" && err != nil || tt.reason != "" && (!errors.As(err, &r) || r.reason != tt.reason) {
			t.Errorf("%s %s: err = %v, want reason %q", tt.network, tt.address, err, tt.reason)
		}
		// The log gets the address; the reason never does.
		if r != nil && (strings.Contains(r.reason, "8.8.8.8") || strings.Contains(r.reason, "127.0.0.1")) {
			t.Errorf("reason %q names the address", r.reason)
		}
	}
}
