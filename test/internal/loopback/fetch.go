package loopback

import (
	"io"
	"net/http"
	"testing"
)

// Fetch sends req with c and returns the response with its whole body read and closed. A
// transport or read error fails the test.
func Fetch(t testing.TB, c *http.Client, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// Get fetches url with a client that keeps no idle connection (nothing outlives the test) and
// returns the response with its whole body read. A transport or read error fails the test.
func Get(t testing.TB, url string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return Fetch(t, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, req)
}
