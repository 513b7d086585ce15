package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestNewProxyRejectsBadUpstream(t *testing.T) {
	for _, u := range []string{"", "127.0.0.1:8000", "ftp://x", "http://"} {
		if _, err := newProxy(u); err == nil {
			t.Errorf("newProxy(%q) accepted", u)
		}
	}
}

// TestRunForwardsAndFlushes checks the one hop: path, body and status pass through, and each
// event of a stream reaches the client before the upstream finishes.
func TestRunForwardsAndFlushes(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusTeapot)
		_, _ = io.WriteString(w, "data: "+r.URL.Path+" "+string(b)+"\n\n")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer up.Close()
	defer close(release)

	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--upstream", up.URL}, pw, io.Discard)
		pw.Close()
	}()
	base, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := client.Post(strings.TrimSpace(base)+"/v1/chat/completions", "application/json", strings.NewReader("hi"))
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: /v1/chat/completions hi\n" || resp.StatusCode != http.StatusTeapot {
		t.Fatalf("first line %q, status %d, err %v", line, resp.StatusCode, err)
	}
	release <- struct{}{}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
