package media

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
)

// startMedia starts the media host double, closed at the end of the test.
func startMedia(t *testing.T) *mediaserver.Server {
	t.Helper()
	m, err := mediaserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// chat is the layout of a chat body.
var chat = Layout{Messages: "messages"}

// newMediaStep builds an inliner from params; allowLoopback exempts loopback addresses (any
// port) from the guard, as the integration stack does. Each gets its own process budget.
func newMediaStep(t testing.TB, own map[string]any, allowLoopback bool) *Inliner {
	t.Helper()
	var o Options
	if allowLoopback {
		o.AllowAddr = netip.Addr.IsLoopback
	}
	p := params.New("params", own, nil)
	s := New(p, o)
	if err := p.Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// newRC is the context of a chat request with body raw and client headers hdr.
func newRC(t testing.TB, raw string, hdr http.Header) *request.Context {
	t.Helper()
	obj, err := body.Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if hdr == nil {
		hdr = http.Header{}
	}
	return &request.Context{ID: "req-1", API: request.APIChat, Path: "/v1/chat/completions", Header: hdr, Body: obj, Log: logr.Discard()}
}

func chatWithImages(urls ...string) string {
	parts := make([]string, len(urls))
	for i, u := range urls {
		parts[i] = fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q,"detail":"low"}}`, u)
	}
	return chatWithParts(parts...)
}

// chatWithParts puts the parts at messages[1].content[1...], after a text part.
func chatWithParts(parts ...string) string {
	return `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"look"}` +
		strings.Repeat(",", min(len(parts), 1)) + strings.Join(parts, ",") + `]}]}`
}

func dataURLOf(mediaType string, n int) string {
	return "data:" + mediaType + ";base64," + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, n))
}

// run executes the step on a chat body with a context that ends with the test.
func run(t *testing.T, s *Inliner, raw string) (*request.Context, error) {
	t.Helper()
	rc := newRC(t, raw, nil)
	return rc, s.Replace(t.Context(), rc, chat)
}

// apiErr asserts err is an *apierror.Error with status, a message containing each of want.
func apiErr(t *testing.T, err error, status int, want ...string) *apierror.Error {
	t.Helper()
	var e *apierror.Error
	if !errors.As(err, &e) || e.Status != status {
		t.Fatalf("err = %v, want HTTP %d", err, status)
	}
	for _, w := range want {
		if !strings.Contains(e.Message, w) {
			t.Fatalf("message %q does not say %q", e.Message, w)
		}
	}
	return e
}

// noRemoteURL asserts the worker-bound body parses and carries no http(s) URL.
func noRemoteURL(t *testing.T, rc *request.Context) {
	t.Helper()
	raw := rc.Body.Bytes()
	if !json.Valid(raw) {
		t.Fatalf("body is not JSON: %.300s", raw)
	}
	if bytes.Contains(bytes.ToLower(raw), []byte("http://")) || bytes.Contains(bytes.ToLower(raw), []byte("https://")) {
		t.Fatalf("a remote URL reaches the workers: %.400s", raw)
	}
}

// part returns messages[1].content[i] of the body, decoded.
func part(t *testing.T, rc *request.Context, i int) map[string]any {
	t.Helper()
	var b struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(rc.Body.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	var parts []map[string]any
	if err := json.Unmarshal(b.Messages[1].Content, &parts); err != nil {
		t.Fatal(err)
	}
	return parts[i]
}

func TestReplaceMediaURLsInlines(t *testing.T) {
	media := startMedia(t)
	s := newMediaStep(t, map[string]any{"max_concurrent_downloads": 2}, true)
	inline := "data:image/png;base64," + base64.StdEncoding.EncodeToString(mediaserver.PNG("inline"))
	raw := chatWithImages(media.URL()+"/held/a.png", inline, media.URL()+"/held/b.png", media.URL()+"/held/c.png")
	rc := newRC(t, raw, http.Header{"Authorization": {"Bearer secret"}, "Cookie": {"c=1"}})
	done := make(chan error, 1)
	go func() { done <- s.Replace(t.Context(), rc, chat) }()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := media.WaitHeld(ctx, 2); err != nil {
		t.Fatalf("downloads do not run concurrently: %v", err)
	}
	media.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if media.HeldPeak() != 2 {
		t.Fatalf("max_concurrent_downloads 2, but %d downloads ran at once", media.HeldPeak())
	}
	noRemoteURL(t, rc)
	if len(rc.Media) != 4 || !rc.MediaScanned {
		t.Fatalf("media = %+v", rc.Media)
	}
	for i, name := range []string{"a", "inline", "b", "c"} {
		m := rc.Media[i]
		want := "data:image/png;base64," + base64.StdEncoding.EncodeToString(mediaserver.PNG(name))
		if m.Message != 1 || m.Part != i+1 || m.Kind != "image_url" || m.ContentType != "image/png" || m.URL != want {
			t.Fatalf("entry %d = %+v", i, m)
		}
		p := part(t, rc, i+1)
		if p["type"] != "image_url" || p["image_url"].(map[string]any)["url"] != want || p["image_url"].(map[string]any)["detail"] != "low" {
			t.Fatalf("part %d = %.200v", i+1, p)
		}
	}
	for _, r := range media.Requests() {
		if r.Header.Get("Authorization") != "" || r.Header.Get("Cookie") != "" {
			t.Fatalf("client credentials reached the media host: %v", r.Header)
		}
	}
	if got, want := s.inFlight.Held(), int64(len(mustGet(t, rc, "messages"))); got != want {
		t.Fatalf("the request holds %d bytes of the budget, want its inlined messages (%d)", got, want)
	}
}

func mustGet(t *testing.T, rc *request.Context, key string) []byte {
	t.Helper()
	v, ok := rc.Body.Get(key)
	if !ok {
		t.Fatalf("no %s", key)
	}
	return v
}

// TestReplaceMediaURLsShapes sends every content-part shape a client or vLLM accepts: each media
// part is inlined into the canonical shape (the worker-bound body carries no remote URL), or the
// request is refused with a 400 naming the part.
func TestReplaceMediaURLsShapes(t *testing.T) {
	media := startMedia(t)
	img := media.URL() + "/img/shape.png"
	vid := media.URL() + "/video/shape.mp4"
	aud := media.URL() + "/audio/shape.mp3"
	png := "data:image/png;base64," + base64.StdEncoding.EncodeToString(mediaserver.PNG("shape"))
	meta := "http://169.254.169.254/latest/meta-data/"
	tests := map[string]struct {
		part string
		// canonical is the type and member the part must end up as, with a data: URL of media type
		// data; entry is whether it is a media entry (every media kind is).
		canonical, data string
		entry           bool
		// unchanged: the part reaches the workers as sent.
		unchanged bool
		// refused: a 400 naming the part and saying this.
		refused string
	}{
		"image_url object":          {part: `{"type":"image_url","image_url":{"url":%q}}`, canonical: "image_url", data: "image/png", entry: true},
		"image_url string":          {part: `{"type":"image_url","image_url":%q}`, canonical: "image_url", data: "image/png", entry: true},
		"image_url without type":    {part: `{"image_url":{"url":%q}}`, canonical: "image_url", data: "image/png", entry: true},
		"image_url string, no type": {part: `{"image_url":%q}`, canonical: "image_url", data: "image/png", entry: true},
		"input_image string":        {part: `{"type":"input_image","image_url":%q,"detail":"auto"}`, canonical: "image_url", data: "image/png", entry: true},
		"input_image object":        {part: `{"type":"input_image","image_url":{"url":%q}}`, canonical: "image_url", data: "image/png", entry: true},
		"image_url with uuid":       {part: `{"type":"image_url","image_url":{"url":%q},"uuid":"u1"}`, canonical: "image_url", data: "image/png", entry: true},
		"video_url object":          {part: `{"type":"video_url","video_url":{"url":"` + vid + `"}}%.0s`, canonical: "video_url", data: "video/mp4", entry: true},
		"video_url string, no type": {part: `{"video_url":"` + vid + `"}%.0s`, canonical: "video_url", data: "video/mp4", entry: true},
		"audio_url object":          {part: `{"type":"audio_url","audio_url":{"url":"` + aud + `"}}%.0s`, canonical: "audio_url", data: "audio/mpeg", entry: true},
		"audio_url string":          {part: `{"type":"audio_url","audio_url":"` + aud + `"}%.0s`, canonical: "audio_url", data: "audio/mpeg", entry: true},
		"inline image string":       {part: `{"type":"image_url","image_url":"` + png + `"}%.0s`, canonical: "image_url", data: "image/png", entry: true},
		"input_audio data":          {part: `{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}%.0s`, unchanged: true, entry: true},
		"text":                      {part: `{"type":"text","text":"see http://example.com","source_url":"http://example.com"}%.0s`, unchanged: true},
		"unknown type, no URL":      {part: `{"type":"widget","widget":{"size":3}}%.0s`, unchanged: true},

		"input_audio with a URL":     {part: `{"type":"input_audio","input_audio":{"url":%q,"format":"wav"}}`, refused: "not a URL"},
		"input_audio as a string":    {part: `{"type":"input_audio","input_audio":%q}`, refused: "not a URL"},
		"input_audio URL as data":    {part: `{"type":"input_audio","input_audio":{"data":%q,"format":"wav"}}`, refused: "base64"},
		"input_audio without data":   {part: `{"type":"input_audio","input_audio":{"format":"wav"}}%.0s`, refused: `no "data"`},
		"file":                       {part: `{"type":"file","file":{"file_url":%q}}`, refused: "file parts are not supported"},
		"file_data":                  {part: `{"type":"file","file":{"file_data":"AAAA","filename":"a.pdf"}}%.0s`, refused: "file parts are not supported"},
		"file_url":                   {part: `{"type":"file_url","file_url":{"url":%q}}`, refused: "file parts are not supported"},
		"image_embeds":               {part: `{"type":"image_embeds","image_embeds":{"url":%q}}`, refused: "embedding inputs"},
		"audio_embeds":               {part: `{"audio_embeds":"AAAA"}%.0s`, refused: "embedding inputs"},
		"prompt_embeds":              {part: `{"type":"prompt_embeds","data":"AAAA"}%.0s`, refused: "embedding inputs"},
		"image_pil":                  {part: `{"image_pil":null}%.0s`, refused: "image_pil"},
		"unknown type with url":      {part: `{"type":"document","url":%q}`, refused: "a URL is only accepted"},
		"unknown type, url below":    {part: `{"type":"document","document":{"url":%q}}`, refused: "a URL is only accepted"},
		"unknown type, *_url":        {part: `{"type":"document_url","document_url":%q}`, refused: "a URL is only accepted"},
		"no type, url":               {part: `{"url":%q}`, refused: "a URL is only accepted"},
		"typed image_url, bare url":  {part: `{"type":"image_url","url":%q}`, refused: "a URL is only accepted"},
		"text carrying image_url":    {part: `{"type":"text","text":"x","uuid":"u","image_url":%q}`, refused: `"text" part cannot carry a image_url`},
		"type and member disagree":   {part: `{"type":"video_url","image_url":{"url":%q}}`, refused: "cannot carry a image_url"},
		"two media members":          {part: `{"image_url":{"url":"` + png + `"},"video_url":%q}`, refused: "not both image_url and video_url"},
		"type not a string":          {part: `{"type":1,"image_url":%q}`, refused: `"type" must be a string`},
		"url beside the media":       {part: `{"type":"image_url","image_url":{"url":"` + png + `"},"source_url":%q}`, refused: "only accepted as the media URL"},
		"url inside the media":       {part: `{"type":"image_url","image_url":{"url":"` + png + `","fallback_url":%q}}`, refused: "only accepted as the media URL"},
		"image_url not a URL":        {part: `{"type":"image_url","image_url":7}%.0s`, refused: "must be a URL string"},
		"image_url empty":            {part: `{"type":"image_url","image_url":{"url":""}}%.0s`, refused: "empty URL"},
		"remote URL to the metadata": {part: `{"type":"image_url","image_url":{"url":%q}}`, refused: "non-public address"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			u := img
			if tc.refused != "" {
				u = meta
			}
			p := fmt.Sprintf(tc.part, u)
			// The media host is exempt by port only; the loopback network is an operator's choice.
			port := mustPort(t, media.URL())
			s := newMediaStep(t, map[string]any{"allowed_networks": []any{"127.0.0.1/32"}, "allowed_ports": []any{port}}, false)
			rc, err := run(t, s, chatWithParts(p))
			if tc.refused != "" {
				e := apiErr(t, err, 400, "messages[1].content[1] (", tc.refused)
				if e.Param != "messages" || strings.Contains(e.Message, "169.254") {
					t.Fatalf("param %q, message %q", e.Param, e.Message)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.unchanged {
				if got := part(t, rc, 1); fmt.Sprint(got) != fmt.Sprint(decodeJSON(t, p)) {
					t.Fatalf("part changed: %v", got)
				}
				if (len(rc.Media) == 1) != tc.entry {
					t.Fatalf("media %+v, want entry=%v", rc.Media, tc.entry)
				}
				return
			}
			noRemoteURL(t, rc)
			got := part(t, rc, 1)
			inner, _ := got[tc.canonical].(map[string]any)
			if got["type"] != tc.canonical || inner == nil || !strings.HasPrefix(fmt.Sprint(inner["url"]), "data:"+tc.data+";base64,") {
				t.Fatalf("part = %.300v, want a canonical %s part with a %s data: URL", got, tc.canonical, tc.data)
			}
			if want := decodeJSON(t, p); want["detail"] != got["detail"] || want["uuid"] != got["uuid"] {
				t.Fatalf("members lost: %.300v", got)
			}
			if (len(rc.Media) == 1) != tc.entry || (tc.entry && rc.Media[0].URL != inner["url"]) {
				t.Fatalf("media %+v, want entry=%v", rc.Media, tc.entry)
			}
		})
	}
}

func decodeJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return m
}

func mustPort(t *testing.T, raw string) int {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	var port int
	if _, err := fmt.Sscan(u.Port(), &port); err != nil {
		t.Fatal(err)
	}
	return port
}

// TestReplaceMediaURLsRejects covers the guard, the checks on data: URLs and downloads, and
// media host failures. A refusal never tells the client an address.
func TestReplaceMediaURLsRejects(t *testing.T) {
	media := startMedia(t)
	port := mustPort(t, media.URL())
	network := map[string]any{"allowed_networks": []any{"127.0.0.1/32"}, "allowed_ports": []any{port}}
	tests := map[string]struct {
		params   map[string]any
		loopback bool
		url      string
		status   int
		msg      string
	}{
		"loopback":                      {url: media.URL() + "/img/a.png", msg: "media URL refused: the host is a non-public address"},
		"localhost":                     {url: "http://localhost/x.png", msg: "media URL refused: the host resolves to a non-public address"},
		"metadata address":              {url: "http://169.254.169.254/latest/meta-data", msg: "non-public address"},
		"upper-case scheme":             {url: "HTTP://169.254.169.254/", msg: "non-public address"},
		"ipv6 loopback":                 {url: "http://[::1]/x.png", msg: "non-public address"},
		"mapped loopback":               {url: "http://[::ffff:127.0.0.1]/x.png", msg: "non-public address"},
		"zoned link-local":              {url: "http://[fe80::1%25lo]/x.png", msg: "non-public address"},
		"NAT64 of the metadata":         {url: "http://[64:ff9b::a9fe:a9fe]/", msg: "non-public address"},
		"6to4":                          {url: "http://[2002:a9fe:a9fe::1]/", msg: "non-public address"},
		"CGNAT":                         {url: "http://100.64.1.1/x.png", msg: "non-public address"},
		"private":                       {url: "http://10.1.2.3/x.png", msg: "non-public address"},
		"private, allowed":              {params: map[string]any{"allow_private_networks": true, "allowed_ports": []any{1}}, url: "http://10.1.2.3:2/x.png", msg: "port 2 is not allowed"},
		"port":                          {url: "http://example.com:8080/x.png", msg: "port 8080 is not allowed"},
		"redirect to the metadata":      {params: network, url: media.URL() + "/redirect?to=http://169.254.169.254/", msg: "it redirects where the host is a non-public address"},
		"redirect to a private address": {params: network, url: media.URL() + "/redirect?to=http://192.168.1.1/x.png", msg: "non-public address"},
		"redirect to another port":      {params: network, url: media.URL() + "/redirect?to=http://127.0.0.1:1/x.png", msg: "port 1 is not allowed"},
		"redirect to a file":            {params: network, url: media.URL() + "/redirect?to=file:///etc/passwd", msg: "only http, https and data: URLs"},
		"too many redirects":            {params: network, url: redirects(media.URL(), 6), msg: "too many redirects"},
		"domain not allowed":            {params: map[string]any{"allowed_domains": []any{"images.example.com"}}, loopback: true, url: media.URL() + "/img/a.png", msg: "not an allowed media domain"},
		"ftp scheme":                    {url: "ftp://x/y.png", msg: "only http, https and data: URLs"},
		"no host":                       {url: "http:///y.png", msg: "the URL has no host"},
		"data url without base64":       {url: "data:image/png,rawbytes", msg: "base64"},
		"data url without comma":        {url: "data:image/png;base64", msg: "no comma"},
		"data url without media type":   {url: "data:;base64,AAAA", msg: "no media type"},
		"data url wrong media type":     {url: "data:text/html;base64,AAAA", msg: "text/html"},
		"data url bad base64":           {url: "data:image/png;base64,@@@@", msg: "not valid padded base64"},
		"data url unpadded":             {url: "data:image/png;base64,AAA", msg: "not valid padded base64"},
		"data url empty":                {url: "data:image/png;base64,", msg: "no data"},
		"not an image":                  {loopback: true, url: media.URL() + "/big?bytes=100&type=text/html", msg: "text/html"},
		"empty download":                {loopback: true, url: media.URL() + "/big?bytes=0", msg: "empty"},
		"media host 404 is a 502":       {loopback: true, url: media.URL() + "/status/404", status: 502, msg: "the media host answered HTTP 404"},
		"a download cut short is a 502": {loopback: true, url: media.URL() + "/big?bytes=1000&declare=5000", status: 502, msg: "the download broke off"},
		"timeout is a 502":              {params: map[string]any{"download_timeout": "100ms"}, loopback: true, url: media.URL() + "/slow?delay=1h", status: 502, msg: "the media host timed out"},
		"timeout in the body":           {params: map[string]any{"download_timeout": "200ms"}, loopback: true, url: media.URL() + "/slow?delay=1h&mode=body", status: 502, msg: "the media host timed out"},
		"unreachable is a 502":          {loopback: true, url: "http://127.0.0.1:1/x.png", status: 502, msg: "the media host could not be reached"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newMediaStep(t, tc.params, tc.loopback)
			_, err := run(t, s, chatWithImages(tc.url))
			status := tc.status
			if status == 0 {
				status = 400
			}
			e := apiErr(t, err, status, "messages[1].content[1] (image_url): ", tc.msg)
			for _, leak := range []string{"127.0.0.1", "::1", "169.254", "10.1.2.3", "192.168", media.URL(), ":53", "lookup", "dial"} {
				if strings.Contains(e.Message, leak) {
					t.Fatalf("the message tells the client %q: %q", leak, e.Message)
				}
			}
			if status == 400 && e.Param != "messages" {
				t.Fatalf("param %q", e.Param)
			}
			if s.inFlight.Held() != 0 {
				t.Fatalf("a failed request holds %d bytes of the budget", s.inFlight.Held())
			}
		})
	}
}

// redirects is a chain of n redirects through the media server to one of its images.
func redirects(base string, n int) string {
	u := "/img/a.png"
	for range n {
		u = base + "/redirect?to=" + url.QueryEscape(u)
	}
	return u
}

func TestFetchFailedHidesTheNetwork(t *testing.T) {
	s := newMediaStep(t, nil, false)
	rc := newRC(t, chatWithImages("http://x.example/a.png"), nil)
	it := &mediaItem{key: "messages", msg: 1, part: 1, label: "image_url"}
	for name, tc := range map[string]struct {
		err    error
		status int
		msg    string
	}{
		"no such host": {&url.Error{Op: "Get", URL: "http://x.example/a.png", Err: &net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "x.example", Server: "10.96.0.10:53", IsNotFound: true}}},
			400, "the media host could not be resolved"},
		"DNS server failure": {&net.DNSError{Err: "server misbehaving", Name: "x.example", Server: "10.96.0.10:53", IsTemporary: true}, 502, "the media host could not be resolved"},
		"DNS timeout":        {&net.DNSError{Err: "i/o timeout", Name: "x.example", Server: "10.96.0.10:53", IsTimeout: true}, 502, "the media host could not be resolved"},
		"refused":            {&net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 80}, Err: errors.New("connection refused")}, 502, "the media host could not be reached"},
	} {
		t.Run(name, func(t *testing.T) {
			err := s.fetchFailed(t.Context(), rc, it, tc.err)
			e := apiErr(t, err, tc.status, "messages[1].content[1] (image_url): "+tc.msg)
			if strings.Contains(e.Message, "10.") || strings.Contains(e.Message, "x.example") || !errors.Is(e, tc.err) {
				t.Fatalf("message %q, cause %v", e.Message, e.Cause)
			}
		})
	}
}

func TestReplaceMediaURLsLimits(t *testing.T) {
	media := startMedia(t)
	big := func(n int, chunked bool) string {
		return fmt.Sprintf("%s/big?bytes=%d&chunked=%v", media.URL(), n, chunked)
	}
	many := make([]string, 33)
	for i := range many {
		many[i] = "data:image/png;base64,AAAA"
	}
	tests := map[string]struct {
		params map[string]any
		urls   []string
		msg    string
	}{
		"an inline item over max_download_size": {params: map[string]any{"max_download_size": 1}, urls: []string{dataURLOf("image/png", 1<<20+1)},
			msg: "messages[1].content[1] (image_url): the media is 1048577 bytes, more than max_download_size (1048576 bytes)"},
		"a download over max_download_size by length": {params: map[string]any{"max_download_size": 1}, urls: []string{big(1<<20+1, false)},
			msg: "messages[1].content[1] (image_url): the media is 1048577 bytes, more than max_download_size"},
		"a download over max_download_size while reading": {params: map[string]any{"max_download_size": 1}, urls: []string{big(3<<20, true)},
			msg: "messages[1].content[1] (image_url): the media is "},
		"inline items over max_request_media_size": {params: map[string]any{"max_request_media_size": 1}, urls: []string{dataURLOf("image/png", 600<<10), dataURLOf("image/png", 600<<10)},
			msg: "messages[1].content[2] (image_url): the request's media is more than max_request_media_size (1048576 bytes)"},
		"downloads over max_request_media_size": {params: map[string]any{"max_request_media_size": 1}, urls: []string{big(600<<10, false), big(600<<10, false)},
			msg: "the request's media is more than max_request_media_size"},
		"chunked downloads over max_request_media_size": {params: map[string]any{"max_request_media_size": 1}, urls: []string{big(600<<10, true), big(600<<10, true)},
			msg: "the request's media is more than max_request_media_size"},
		"inline and downloads over max_request_media_size": {params: map[string]any{"max_request_media_size": 1}, urls: []string{dataURLOf("image/png", 600<<10), big(600<<10, true)},
			msg: "messages[1].content[2] (image_url): the request's media is more than max_request_media_size"},
		"too many items": {params: map[string]any{"max_multimodal_entries": 2}, urls: many[:3], msg: "too many multimodal items: got 3, max 2"},
		"the default":    {urls: many, msg: "too many multimodal items: got 33, max 32"},
		"the inlined body over max_inlined_body_size": {params: map[string]any{"max_inlined_body_size": 1}, urls: []string{big(800<<10, false)},
			msg: "with its media inlined the request is 10"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			media.Reset()
			s := newMediaStep(t, tc.params, true)
			_, err := run(t, s, chatWithImages(tc.urls...))
			_ = apiErr(t, err, 400, tc.msg)
			if s.inFlight.Held() != 0 {
				t.Fatalf("a refused request holds %d bytes", s.inFlight.Held())
			}
			if strings.Contains(name, "too many") || name == "the default" {
				if n := len(media.Requests()); n != 0 {
					t.Fatalf("%d downloads for a request refused up front", n)
				}
			}
		})
	}
}

// waitInFlight waits for c to reach want (releases run when a request's context ends, in their
// own goroutine).
func waitInFlight(t *testing.T, c *budget.Bytes, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.Held() != want {
		if time.Now().After(deadline) {
			t.Fatalf("in-flight media is %d bytes, want %d", c.Held(), want)
		}
		runtime.Gosched()
	}
}

// TestReplaceMediaURLsProcessBudget: requests share one budget, across steps (a reload), hold
// their inlined bodies until they end, and are refused with a 429 and Retry-After over it.
func TestReplaceMediaURLsProcessBudget(t *testing.T) {
	media := startMedia(t)
	own := map[string]any{"max_request_media_size": 1, "max_inlined_body_size": 2, "max_inflight_media_size": 3}
	old, reloaded := newMediaStep(t, own, true), newMediaStep(t, own, true)
	reloaded.inFlight = old.inFlight
	img := chatWithImages(media.URL() + "/big?bytes=700000")
	start := func(s *Inliner) (context.CancelFunc, int64, error) {
		ctx, cancel := context.WithCancel(t.Context())
		rc := newRC(t, img, nil)
		err := s.Replace(ctx, rc, chat)
		if err != nil {
			return cancel, 0, err
		}
		return cancel, int64(len(mustGet(t, rc, "messages"))), nil
	}
	end1, held1, err := start(old)
	if err != nil || old.inFlight.Held() != held1 {
		t.Fatalf("err %v, in flight %d, want %d", err, old.inFlight.Held(), held1)
	}
	end2, held2, err := start(reloaded)
	if err != nil || old.inFlight.Held() != held1+held2 {
		t.Fatalf("err %v, in flight %d, want %d", err, old.inFlight.Held(), held1+held2)
	}
	defer end2()
	// A third needs 700000 bytes to download and ~935000 for its body: over 3 MiB.
	end3, _, err := start(old)
	end3()
	e := apiErr(t, err, http.StatusTooManyRequests, "max_inflight_media_size")
	if e.RetryAfter != time.Second || old.inFlight.Held() != held1+held2 {
		t.Fatalf("RetryAfter %v, in flight %d, want %d", e.RetryAfter, old.inFlight.Held(), held1+held2)
	}
	end1() // the first request ends: its body is let go
	waitInFlight(t, old.inFlight, held2)
	end3, held3, err := start(old)
	if err != nil || held3 == 0 {
		t.Fatalf("after a request ended: %v", err)
	}
	end3()
	waitInFlight(t, old.inFlight, held2)
}

// TestMediaUseRefusedLetsGoAtOnce: a request refused by the budget lets go of what it holds at
// once (its other downloads may still be stopping), so requests that fill the budget together do
// not refuse each other down to the last one.
func TestMediaUseRefusedLetsGoAtOnce(t *testing.T) {
	s := newMediaStep(t, nil, false)
	s.maxInFlight = 100
	a, b := &mediaUse{s: s}, &mediaUse{s: s}
	steps := []struct {
		use      *mediaUse
		op       string
		n        int64
		refused  bool
		inFlight int64
	}{
		{a, "hold", 40, false, 40},
		{b, "hold", 40, false, 80},
		{a, "hold", 30, true, 40},   // refused: a's 40 are let go now, not when a ends
		{b, "hold", 60, false, 100}, // so b, the last one standing, gets all it needs
		{a, "hold", 1, true, 100},   // a stays refused, holding nothing
		{a, "drop", 10, false, 100}, // a late drop of a's stops nothing of b's
		{a, "release", 0, false, 100},
		{b, "drop", 30, false, 70},
		{b, "release", 0, false, 0},
		{b, "release", 0, false, 0},
	}
	for i, st := range steps {
		var err error
		switch st.op {
		case "hold":
			err = st.use.hold(st.n)
		case "drop":
			st.use.drop(st.n)
		case "release":
			st.use.release()
		}
		if st.refused {
			if e := apiErr(t, err, http.StatusTooManyRequests, "max_inflight_media_size"); e.RetryAfter != time.Second {
				t.Fatalf("step %d: Retry-After %v, want 1s", i, e.RetryAfter)
			}
		} else if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := s.inFlight.Held(); got != st.inFlight {
			t.Fatalf("step %d (%s %d): in flight %d, want %d", i, st.op, st.n, got, st.inFlight)
		}
	}
	if a.holding() != 0 || b.holding() != 0 {
		t.Fatalf("held after release: %d, %d", a.holding(), b.holding())
	}
}

func TestReplaceMediaURLsParams(t *testing.T) {
	for name, tc := range map[string]struct {
		own  map[string]any
		key  string
		want string
	}{
		"zero concurrency":         {map[string]any{"max_concurrent_downloads": 0}, "params.max_concurrent_downloads", "at least 1"},
		"negative entries":         {map[string]any{"max_multimodal_entries": -1}, "params.max_multimodal_entries", "at least 0"},
		"zero entries":             {map[string]any{"max_multimodal_entries": 0}, "params.max_multimodal_entries", "0 no longer means unlimited"},
		"zero size":                {map[string]any{"max_download_size": 0}, "params.max_download_size", "at least 1"},
		"huge size":                {map[string]any{"max_download_size": 1 << 40}, "params.max_download_size", "at most"},
		"zero request size":        {map[string]any{"max_request_media_size": 0}, "params.max_request_media_size", "at least 1"},
		"zero body size":           {map[string]any{"max_inlined_body_size": 0}, "params.max_inlined_body_size", "at least 1"},
		"budget below one request": {map[string]any{"max_inflight_media_size": 95}, "params.max_inflight_media_size", "at least max_request_media_size + max_inlined_body_size (96 MiB)"},
		"timeout no unit":          {map[string]any{"download_timeout": "10"}, "params.download_timeout", "unit"},
		"domains not list":         {map[string]any{"allowed_domains": "example.com"}, "params.allowed_domains", "list"},
		"domain with path":         {map[string]any{"allowed_domains": []any{"example.com/x"}}, "params.allowed_domains", "not a domain"},
		"private not bool":         {map[string]any{"allow_private_networks": "yes"}, "params.allow_private_networks", "boolean"},
		"network not a prefix":     {map[string]any{"allowed_networks": []any{"10.0.0.0/33"}}, "params.allowed_networks", "not a CIDR"},
		"network with host bits":   {map[string]any{"allowed_networks": []any{"10.0.0.1/8"}}, "params.allowed_networks", "did you mean 10.0.0.0/8"},
		"network mapped":           {map[string]any{"allowed_networks": []any{"::ffff:10.0.0.0/104"}}, "params.allowed_networks", "IPv4-mapped"},
		"ports not a list":         {map[string]any{"allowed_ports": 80}, "params.allowed_ports", "list"},
		"ports empty":              {map[string]any{"allowed_ports": []any{}}, "params.allowed_ports", "non-empty"},
		"port zero":                {map[string]any{"allowed_ports": []any{0}}, "params.allowed_ports", "1-65535"},
		"port too big":             {map[string]any{"allowed_ports": []any{65536}}, "params.allowed_ports", "1-65535"},
		"port not a number":        {map[string]any{"allowed_ports": []any{"80"}}, "params.allowed_ports", "port number"},
		"unknown parameter":        {map[string]any{"max_downloads": 1}, "params.max_downloads", "unknown"},
	} {
		t.Run(name, func(t *testing.T) {
			p := params.New("params", tc.own, nil)
			New(p, Options{})
			if key := config.KeyOf(p.Err()); key != tc.key || !strings.Contains(p.Err().Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %s saying %q", p.Err(), tc.key, tc.want)
			}
		})
	}
	// Accepted forms.
	p := params.New("params", map[string]any{"allowed_networks": []any{"10.20.0.0/16", "192.0.2.7", "fd00:ec2::/32"}, "allowed_ports": []any{8080, 443.0, int64(80)}}, nil)
	s := New(p, Options{})
	if p.Err() != nil {
		t.Fatal(p.Err())
	}
	g := s.guard
	if fmt.Sprint(g.ports) != "[8080 443 80]" || g.checkAddr(netip.MustParseAddr("192.0.2.7")) != nil || g.checkAddr(netip.MustParseAddr("192.0.2.8")) == nil ||
		g.checkAddr(netip.MustParseAddr("10.20.3.4")) != nil || g.checkAddr(netip.MustParseAddr("fd00:ec2::254")) != nil {
		t.Fatalf("ports %v", g.ports)
	}
}

// responsesWithParts is a Responses body whose second input item holds a text part and parts.
func responsesWithParts(parts ...string) string {
	return `{"model":"m","input":[{"role":"system","content":"be brief"},{"type":"message","role":"user","content":[{"type":"input_text","text":"look"}` +
		strings.Repeat(",", min(len(parts), 1)) + strings.Join(parts, ",") + `]}],"store":false}`
}

// TestReplaceMediaURLsResponses: a Responses request's media go through the same guard as chat's
// and stay in the Responses API's own shape (input_image with its URL as a string), since the
// workers serve the Responses API themselves; the chat-only part types are refused.
func TestReplaceMediaURLsResponses(t *testing.T) {
	media := startMedia(t)
	img := media.URL() + "/img/shape.png"
	meta := "http://169.254.169.254/latest/meta-data/"
	tests := map[string]struct {
		part    string
		refused string
	}{
		"input_image string":        {part: `{"type":"input_image","image_url":%q,"detail":"high"}`},
		"input_image object":        {part: `{"type":"input_image","image_url":{"url":%q,"detail":"low"}}`},
		"a remote URL to metadata":  {part: `{"type":"input_image","image_url":"` + meta + `"}%.0s`, refused: "non-public address"},
		"a chat image_url part":     {part: `{"type":"image_url","image_url":{"url":%q}}`, refused: "input_image or input_audio"},
		"a video_url part":          {part: `{"type":"video_url","video_url":%q}`, refused: "input_image or input_audio"},
		"a URL beside the image":    {part: `{"type":"input_image","image_url":%q,"source_url":"http://x/"}`, refused: "only accepted as the media URL"},
		"an input_file with a URL":  {part: `{"type":"input_file","file_url":%q}`, refused: "cannot carry a file_url member"},
		"an input_image not a URL":  {part: `{"type":"input_image","image_url":7}%.0s`, refused: "must be a URL string"},
		"input_audio with a URL":    {part: `{"type":"input_audio","input_audio":{"url":%q}}`, refused: "not a URL"},
		"input_image with no value": {part: `{"type":"input_image","image_url":""}%.0s`, refused: "empty URL"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newMediaStep(t, map[string]any{"allowed_networks": []any{"127.0.0.1/32"}, "allowed_ports": []any{mustPort(t, media.URL())}}, false)
			rc := newRC(t, responsesWithParts(fmt.Sprintf(tc.part, img)), nil)
			err := s.Replace(t.Context(), rc, Layout{Messages: "input", Input: true})
			if tc.refused != "" {
				e := apiErr(t, err, 400, "input[1].content[1] (", tc.refused)
				if e.Param != "input" || strings.Contains(e.Message, "169.254") {
					t.Fatalf("param %q, message %q", e.Param, e.Message)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			noRemoteURL(t, rc)
			var b struct {
				Input []struct {
					Content json.RawMessage `json:"content"`
				} `json:"input"`
				Store *bool `json:"store"`
			}
			if err := json.Unmarshal(rc.Body.Bytes(), &b); err != nil {
				t.Fatal(err)
			}
			var parts []map[string]any
			if err := json.Unmarshal(b.Input[1].Content, &parts); err != nil {
				t.Fatal(err)
			}
			got := parts[1]
			u, _ := got["image_url"].(string)
			if got["type"] != "input_image" || !strings.HasPrefix(u, "data:image/png;base64,") || got["detail"] == nil || b.Store == nil {
				t.Fatalf("part %.200v, want input_image with a data: URL string and its detail", got)
			}
			if len(rc.Media) != 1 || rc.Media[0].URL != u || rc.Media[0].Message != 1 || rc.Media[0].Part != 1 {
				t.Fatalf("media %+v", rc.Media)
			}
		})
	}
}
