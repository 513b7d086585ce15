package mediaserver

import (
	"bytes"
	"context"
	"errors"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/epd-dev/coordinator/test/internal/loopback"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testClient never follows redirects nor keeps idle connections.
var testClient = &http.Client{
	Transport:     &http.Transport{DisableKeepAlives: true},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// startServer starts a media server closed at the end of the test.
func startServer(t *testing.T) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// get fetches url and returns the response with its body read.
func get(t *testing.T, url string, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	return loopback.Fetch(t, testClient, req)
}

func TestPNG(t *testing.T) {
	s := startServer(t)
	sizes := map[int]bool{}
	for _, name := range []string{"cat", "dog", "a", "a-much-longer-name"} {
		t.Run(name, func(t *testing.T) {
			resp, body := get(t, s.URL()+"/img/"+name+".png")
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "image/png" ||
				resp.Header.Get("Content-Length") != strconv.Itoa(len(body)) {
				t.Fatalf("status %d headers %v", resp.StatusCode, resp.Header)
			}
			if !bytes.Equal(body, PNG(name)) || !bytes.Equal(PNG(name), PNG(name)) {
				t.Error("body is not the deterministic PNG")
			}
			img, err := png.Decode(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if b := img.Bounds(); b.Dx() < 16 || b.Dx() > 143 || b.Dy() < 16 || b.Dy() > 143 {
				t.Errorf("bounds %v", b)
			}
			sizes[len(body)] = true
		})
	}
	if len(sizes) < 3 {
		t.Errorf("PNG sizes do not vary by name: %v", sizes)
	}
	for _, path := range []string{"/img/cat.jpg", "/img/.png", "/img/"} {
		if resp, _ := get(t, s.URL()+path); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: status %d, want 404", path, resp.StatusCode)
		}
	}
}

func TestBig(t *testing.T) {
	s := startServer(t)
	tests := []struct {
		name        string
		query       string
		wantStatus  int
		wantLen     int
		wantChunked bool
	}{
		{"with length", "bytes=100000", 200, 100000, false},
		{"chunked", "bytes=70000&chunked=1", 200, 70000, true},
		{"empty", "bytes=0", 200, 0, false},
		{"tiny", "bytes=2", 200, 2, false},
		{"typed", "bytes=10&type=video/mp4", 200, 10, false},
		{"bad type", "bytes=10&type=no%20type", 400, 0, false},
		{"declared shorter", "bytes=10&declare=5", 400, 0, false},
		{"declared and chunked", "bytes=10&declare=20&chunked=1", 400, 0, false},
		{"missing", "", 400, 0, false},
		{"negative", "bytes=-1", 400, 0, false},
		{"too big", "bytes=99999999999999", 400, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := get(t, s.URL()+"/big?"+tt.query)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if tt.wantStatus != 200 {
				return
			}
			wantType := "image/jpeg"
			if strings.Contains(tt.query, "type=") {
				wantType = "video/mp4"
			}
			if resp.Header.Get("Content-Type") != wantType || !bytes.Equal(body, BigBody(tt.wantLen)) {
				t.Errorf("content type %q, %d bytes", resp.Header.Get("Content-Type"), len(body))
			}
			chunked := resp.ContentLength == -1
			if chunked != tt.wantChunked {
				t.Errorf("ContentLength %d, want chunked=%v", resp.ContentLength, tt.wantChunked)
			}
		})
	}
	if b := BigBody(6); !bytes.Equal(b[:4], []byte{0xFF, 0xD8, 0xFF, 0xE0}) {
		t.Errorf("BigBody does not start with a JPEG marker: %x", b)
	}
}

func TestSlow(t *testing.T) {
	s := startServer(t)
	start := time.Now()
	resp, body := get(t, s.URL()+"/slow?delay=150ms")
	if d := time.Since(start); d < 150*time.Millisecond || resp.StatusCode != http.StatusOK || !bytes.Equal(body, PNG("slow")) {
		t.Errorf("took %v, status %d", d, resp.StatusCode)
	}
	if resp, _ := get(t, s.URL()+"/slow?delay=20"); resp.StatusCode != http.StatusOK {
		t.Errorf("millisecond delay: status %d", resp.StatusCode)
	}
	if resp, _ := get(t, s.URL()+"/slow?delay=soon"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad delay: status %d", resp.StatusCode)
	}

	// mode=body: headers at once, body after the delay.
	start = time.Now()
	req, _ := http.NewRequest(http.MethodGet, s.URL()+"/slow?delay=400ms&mode=body", nil)
	r2, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Body.Close()
	if d := time.Since(start); d >= 400*time.Millisecond {
		t.Errorf("headers after %v", d)
	}
	b, _ := io.ReadAll(r2.Body)
	if d := time.Since(start); d < 400*time.Millisecond || !bytes.Equal(b, PNG("slow")) {
		t.Errorf("body after %v", d)
	}

	// A client timeout ends the handler (goleak checks at exit).
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+"/slow?delay=1h", nil)
	if _, err := testClient.Do(req); err == nil {
		t.Error("request did not time out")
	}
}

func TestStatusAndRedirect(t *testing.T) {
	s := startServer(t)
	tests := []struct {
		path         string
		wantStatus   int
		wantLocation string
	}{
		{"/status/404", 404, ""},
		{"/status/503", 503, ""},
		{"/status/204", 204, ""},
		{"/status/200", 200, ""},
		{"/status/abc", 400, ""},
		{"/status/99", 400, ""},
		{"/redirect?to=http://169.254.169.254/latest/meta-data", 302, "http://169.254.169.254/latest/meta-data"},
		{"/redirect?to=/img/cat.png&code=307", 307, "/img/cat.png"},
		{"/redirect?to=file:///etc/passwd&code=301", 301, "file:///etc/passwd"},
		{"/redirect", 400, ""},
		{"/redirect?to=x&code=200", 400, ""},
		{"/nope", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp, _ := get(t, s.URL()+tt.path)
			if resp.StatusCode != tt.wantStatus || resp.Header.Get("Location") != tt.wantLocation {
				t.Errorf("status %d location %q, want %d %q", resp.StatusCode, resp.Header.Get("Location"), tt.wantStatus, tt.wantLocation)
			}
		})
	}
}

func TestRecordsRequests(t *testing.T) {
	s := startServer(t)
	get(t, s.URL()+"/img/a.png?v=1", "User-Agent", "coordinator-test")
	get(t, s.URL()+"/status/500", "Authorization", "Bearer secret", "Cookie", "session=1")
	reqs := s.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	if r := reqs[0]; r.Method != http.MethodGet || r.Path != "/img/a.png" || r.Query != "v=1" || r.Header.Get("User-Agent") != "coordinator-test" ||
		r.Header.Get("Authorization") != "" || r.Time.IsZero() || r.RemoteAddr == "" {
		t.Errorf("request 0 = %+v", r)
	}
	if r := reqs[1]; r.Header.Get("Authorization") != "Bearer secret" || r.Header.Get("Cookie") != "session=1" {
		t.Errorf("request 1 headers %v", r.Header)
	}
	reqs[1].Header.Del("Cookie")
	if s.Requests()[1].Header.Get("Cookie") == "" {
		t.Error("Requests shares header maps")
	}
	s.Reset()
	if len(s.Requests()) != 0 {
		t.Error("Reset kept requests")
	}
}

func TestAsHandler(t *testing.T) {
	s := New()
	srv := httptest.NewServer(s)
	defer srv.Close()
	resp, body := get(t, srv.URL+"/img/x.png")
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, PNG("x")) || s.URL() != "" || len(s.Requests()) != 1 {
		t.Errorf("status %d, URL %q", resp.StatusCode, s.URL())
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}

func TestHeld(t *testing.T) {
	s := startServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	type result struct {
		status int
		body   []byte
	}
	results := make(chan result, 2)
	for _, name := range []string{"h1", "h2"} {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL()+"/held/"+name+".png", nil)
			resp, err := testClient.Do(req)
			if err != nil {
				results <- result{}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			results <- result{resp.StatusCode, b}
		}()
	}
	if err := s.WaitHeld(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if len(results) != 0 {
		t.Fatal("a held request was answered before Release")
	}
	s.Release()
	for range 2 {
		if r := <-results; r.status != http.StatusOK || (!bytes.Equal(r.body, PNG("h1")) && !bytes.Equal(r.body, PNG("h2"))) {
			t.Errorf("status %d", r.status)
		}
	}
	if s.HeldPeak() != 2 {
		t.Errorf("peak %d, want 2", s.HeldPeak())
	}
	// After Release, /held answers at once.
	if resp, body := get(t, s.URL()+"/held/h3.png"); resp.StatusCode != http.StatusOK || !bytes.Equal(body, PNG("h3")) {
		t.Errorf("after Release: status %d", resp.StatusCode)
	}
	if resp, _ := get(t, s.URL()+"/held/x.jpg"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("bad name: status %d", resp.StatusCode)
	}
	short, cancelShort := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancelShort()
	if err := s.WaitHeld(short, 1); err == nil {
		t.Error("WaitHeld returned without held requests")
	}
}

func TestBigCutShort(t *testing.T) {
	s := startServer(t)
	resp, err := testClient.Get(s.URL() + "/big?bytes=1000&declare=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.ContentLength != 5000 || !errors.Is(err, io.ErrUnexpectedEOF) || !bytes.Equal(b, BigBody(1000)) {
		t.Fatalf("ContentLength %d, %d bytes, err %v", resp.ContentLength, len(b), err)
	}
}
