package steps

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
)

func pngBytes(t *testing.T, w int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, w))
	img.Set(0, 0, color.RGBA{R: 255, A: 255})
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// mediaHost serves /a.png, /b.png, /html, /big, /slow, /404, /redirect?to=... and records headers.
type mediaHost struct {
	srv      *httptest.Server
	mu       sync.Mutex
	headers  []http.Header
	inFlight atomic.Int32
	peak     atomic.Int32
}

func newMediaHost(t *testing.T) *mediaHost {
	m := &mediaHost{}
	a, b := pngBytes(t, 4), pngBytes(t, 8)
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := m.inFlight.Add(1)
		defer m.inFlight.Add(-1)
		for p := m.peak.Load(); n > p && !m.peak.CompareAndSwap(p, n); p = m.peak.Load() {
		}
		m.mu.Lock()
		m.headers = append(m.headers, r.Header.Clone())
		m.mu.Unlock()
		switch r.URL.Path {
		case "/a.png":
			time.Sleep(30 * time.Millisecond)
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(a)
		case "/b.png":
			time.Sleep(30 * time.Millisecond)
			_, _ = w.Write(b) // no content type: sniffed
		case "/html":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte("<html></html>"))
		case "/big":
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(bytes.Repeat([]byte{1}, 2<<20))
		case "/big-chunked":
			w.Header().Set("Content-Type", "image/png")
			for i := 0; i < 3; i++ {
				_, _ = w.Write(bytes.Repeat([]byte{1}, 1<<20))
				w.(http.Flusher).Flush()
			}
		case "/slow":
			time.Sleep(2 * time.Second)
		case "/redirect":
			http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(m.srv.Close)
	return m
}

func newMediaStep(t *testing.T, own map[string]any, allowLoopback bool) pipeline.Step {
	t.Helper()
	deps := registry.Deps{Log: logr.Discard()}
	if allowLoopback {
		deps.Overrides.MediaAllowAddr = netip.Addr.IsLoopback
	}
	p := params.New("params", own, nil)
	s, err := newReplaceMediaURLs(deps, p)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func chatWithImages(urls ...string) string {
	parts := []string{`{"type":"text","text":"look"}`}
	for _, u := range urls {
		parts = append(parts, fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q,"detail":"low"}}`, u))
	}
	return `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`
}

func TestReplaceMediaURLsInlines(t *testing.T) {
	host := newMediaHost(t)
	s := newMediaStep(t, map[string]any{"max_concurrent_downloads": 2}, true)
	inline := "data:image/png;base64," + base64.StdEncoding.EncodeToString(pngBytes(t, 2))
	rc, _ := newRC(t, "/v1/chat/completions", chatWithImages(host.srv.URL+"/a.png", inline, host.srv.URL+"/b.png"),
		http.Header{"Authorization": {"Bearer secret"}, "Cookie": {"c=1"}})
	if err := s.Execute(context.Background(), rc); err != nil {
		t.Fatal(err)
	}
	if len(rc.Media) != 3 || !rc.MediaScanned {
		t.Fatalf("media = %+v", rc.Media)
	}
	for i, m := range rc.Media {
		if m.Message != 1 || m.Part != i+1 || m.ContentType != "image/png" || !strings.HasPrefix(m.URL, "data:image/png;base64,") {
			t.Fatalf("entry %d = %+v", i, m)
		}
	}
	if rc.Media[1].URL != inline {
		t.Fatal("inline data URL changed")
	}
	msgs, _ := rc.Body.Get("messages")
	if strings.Contains(string(msgs), host.srv.URL) || !strings.Contains(string(msgs), `"detail":"low"`) ||
		strings.Count(string(msgs), "data:image/png;base64,") != 3 {
		t.Fatalf("messages not inlined: %.300s", msgs)
	}
	if host.peak.Load() != 2 {
		t.Fatalf("downloads did not run concurrently: peak %d", host.peak.Load())
	}
	for _, h := range host.headers {
		if h.Get("Authorization") != "" || h.Get("Cookie") != "" {
			t.Fatalf("client credentials reached the media host: %v", h)
		}
	}
}

func TestReplaceMediaURLsRejects(t *testing.T) {
	host := newMediaHost(t)
	tests := map[string]struct {
		params   map[string]any
		loopback bool
		url      string
		urls     []string
		status   int
		msg      string
	}{
		"loopback blocked":              {url: host.srv.URL + "/a.png", status: 400, msg: "is not allowed"},
		"metadata address blocked":      {loopback: true, url: "http://169.254.169.254/latest/meta-data", status: 400, msg: "169.254.169.254"},
		"ipv6 loopback blocked":         {url: "http://[::1]:1/x.png", status: 400, msg: "not allowed"},
		"CGNAT blocked":                 {loopback: true, url: "http://100.64.1.1/x.png", status: 400, msg: "100.64.1.1"},
		"private blocked":               {loopback: true, url: "http://10.1.2.3/x.png", status: 400, msg: "allow_private_networks"},
		"redirect to metadata blocked":  {loopback: true, url: host.srv.URL + "/redirect?to=http://169.254.169.254/", status: 400, msg: "169.254.169.254"},
		"redirect to private blocked":   {loopback: true, url: host.srv.URL + "/redirect?to=http://192.168.1.1/x.png", status: 400, msg: "private"},
		"redirect to file blocked":      {loopback: true, url: host.srv.URL + "/redirect?to=file:///etc/passwd", status: 400, msg: "blocked"},
		"domain not allowed":            {params: map[string]any{"allowed_domains": []any{"images.example.com"}}, loopback: true, url: host.srv.URL + "/a.png", status: 400, msg: "allowed_domains"},
		"ftp scheme":                    {url: "ftp://x/y.png", status: 400, msg: "http(s) or data:"},
		"too many items":                {params: map[string]any{"max_multimodal_entries": 1}, urls: []string{"data:image/png;base64,AAAA", "data:image/png;base64,AAAA"}, status: 400, msg: "too many multimodal items"},
		"data url without base64":       {url: "data:image/png,rawbytes", status: 400, msg: "base64"},
		"data url without comma":        {url: "data:image/png;base64", status: 400, msg: "no comma"},
		"data url without media type":   {url: "data:;base64,AAAA", status: 400, msg: "no media type"},
		"data url wrong media type":     {url: "data:text/html;base64,AAAA", status: 400, msg: "text/html"},
		"data url bad base64":           {url: "data:image/png;base64,@@@@", status: 400, msg: "not valid base64"},
		"data url empty":                {url: "data:image/png;base64,", status: 400, msg: "no data"},
		"not an image":                  {loopback: true, url: host.srv.URL + "/html", status: 400, msg: "text/html"},
		"too large by length":           {params: map[string]any{"max_download_size": 1}, loopback: true, url: host.srv.URL + "/big", status: 400, msg: "max_download_size"},
		"too large while reading":       {params: map[string]any{"max_download_size": 1}, loopback: true, url: host.srv.URL + "/big-chunked", status: 400, msg: "max_download_size"},
		"media host 404 is a 502":       {loopback: true, url: host.srv.URL + "/404", status: 502, msg: "HTTP 404"},
		"media host timeout is a 502":   {params: map[string]any{"download_timeout": "100ms"}, loopback: true, url: host.srv.URL + "/slow", status: 502, msg: "download failed"},
		"media host unreachable is 502": {loopback: true, url: "http://127.0.0.1:1/x.png", status: 502, msg: "download failed"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newMediaStep(t, tc.params, tc.loopback)
			urls := tc.urls
			if urls == nil {
				urls = []string{tc.url}
			}
			rc, _ := newRC(t, "/v1/chat/completions", chatWithImages(urls...), nil)
			err := s.Execute(context.Background(), rc)
			var e *apierror.Error
			if !errors.As(err, &e) || e.Status != tc.status || !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("err = %v, want %d containing %q", err, tc.status, tc.msg)
			}
			if tc.status == 400 && (e.Param != "messages" || (len(urls) == 1 && !strings.Contains(e.Message, "messages[1].content[1]"))) {
				t.Fatalf("error does not name the part: %s (param %q)", e.Message, e.Param)
			}
		})
	}
}

func TestReplaceMediaURLsSkips(t *testing.T) {
	s := newMediaStep(t, nil, false)
	for path, b := range map[string]string{
		"/v1/completions":        `{"prompt":"http://127.0.0.1/x.png"}`,
		"/inference/v1/generate": `{"token_ids":[1]}`,
		"/v1/chat/completions":   `{"messages":[{"role":"user","content":"http://127.0.0.1/x.png"},{"role":"user","content":[{"type":"text","text":"t"},{"type":"video_url","video_url":{"url":"http://127.0.0.1/v.mp4"}}]}]}`,
	} {
		rc, _ := newRC(t, path, b, nil)
		before := string(rc.Body.Bytes())
		if err := s.Execute(context.Background(), rc); err != nil || len(rc.Media) != 0 || string(rc.Body.Bytes()) != before {
			t.Fatalf("%s: err=%v media=%v", path, err, rc.Media)
		}
	}
}

func TestReplaceMediaURLsParams(t *testing.T) {
	for name, tc := range map[string]struct {
		own map[string]any
		key string
	}{
		"zero concurrency":  {map[string]any{"max_concurrent_downloads": 0}, "params.max_concurrent_downloads"},
		"negative entries":  {map[string]any{"max_multimodal_entries": -1}, "params.max_multimodal_entries"},
		"zero size":         {map[string]any{"max_download_size": 0}, "params.max_download_size"},
		"timeout no unit":   {map[string]any{"download_timeout": "10"}, "params.download_timeout"},
		"domains not list":  {map[string]any{"allowed_domains": "example.com"}, "params.allowed_domains"},
		"domain with path":  {map[string]any{"allowed_domains": []any{"example.com/x"}}, "params.allowed_domains"},
		"private not bool":  {map[string]any{"allow_private_networks": "yes"}, "params.allow_private_networks"},
		"unknown parameter": {map[string]any{"max_downloads": 1}, "params.max_downloads"},
	} {
		t.Run(name, func(t *testing.T) {
			p := params.New("params", tc.own, nil)
			_, _ = newReplaceMediaURLs(registry.Deps{Log: logr.Discard()}, p)
			if key := config.KeyOf(p.Err()); key != tc.key {
				t.Fatalf("err = %v, want one naming %s", p.Err(), tc.key)
			}
		})
	}
}

func TestNetGuard(t *testing.T) {
	g := &netGuard{}
	for addr, blocked := range map[string]bool{
		"8.8.8.8": false, "127.0.0.1": true, "169.254.169.254": true, "0.0.0.0": true, "100.64.0.1": true,
		"10.0.0.1": true, "172.16.0.1": true, "192.168.0.1": true, "::1": true, "fe80::1": true, "fd00::1": true,
		"::ffff:127.0.0.1": true, "2001:4860:4860::8888": false, "224.0.0.1": true,
	} {
		if err := g.checkAddr(netip.MustParseAddr(addr)); (err != nil) != blocked {
			t.Errorf("%s: err = %v, want blocked=%v", addr, err, blocked)
		}
	}
	private := &netGuard{allowPrivate: true}
	if private.checkAddr(netip.MustParseAddr("10.0.0.1")) != nil || private.checkAddr(netip.MustParseAddr("127.0.0.1")) == nil ||
		private.checkAddr(netip.MustParseAddr("fd00::1")) == nil {
		t.Fatal("allow_private_networks must only open RFC 1918")
	}
	d := &netGuard{domains: []string{"example.com"}}
	if d.checkHost("img.example.com") != nil || d.checkHost("EXAMPLE.com.") != nil || d.checkHost("badexample.com") == nil {
		t.Fatal("domain allowlist")
	}
}
