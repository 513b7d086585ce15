package simworker

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testClient never keeps idle connections, so nothing outlives a test.
var testClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// startWorker starts a worker that is closed when the test ends.
func startWorker(t *testing.T, cfg Config) *Worker {
	t.Helper()
	w, err := Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := w.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return w
}

// reply is a buffered HTTP response.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// String describes the reply for failure messages.
func (r reply) String() string { return string(r.body) }

// do sends one request; body is JSON-encoded unless it is a string or []byte.
func do(t *testing.T, method, url string, body any, header http.Header) reply {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

// post sends a JSON POST to w at path.
func post(t *testing.T, w *Worker, path string, body any, header ...string) reply {
	t.Helper()
	h := http.Header{}
	for i := 0; i+1 < len(header); i += 2 {
		h.Add(header[i], header[i+1])
	}
	return do(t, http.MethodPost, w.URL()+path, body, h)
}

// mustStatus fails the test unless r has the wanted status.
func mustStatus(t *testing.T, r reply, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("status %d, want %d; body %s", r.status, want, r.body)
	}
}

// decode unmarshals b into a new T.
func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return v
}

// obj is a JSON object under construction.
type obj = map[string]any

// userChat returns a chat request with one user message and extra fields.
func userChat(text string, extra obj) obj {
	b := obj{"model": DefaultModelName, "messages": []obj{{"role": "user", "content": text}}}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// completion returns a completions request with extra fields.
func completion(prompt any, extra obj) obj {
	b := obj{"model": DefaultModelName, "prompt": prompt}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// generate returns a generate request with sampling params and extra fields.
func generate(ids []int, sampling obj, extra obj) obj {
	b := obj{"model": DefaultModelName, "token_ids": ids, "sampling_params": sampling}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// errorMessage extracts the message of a vLLM-style error body.
func errorMessage(t *testing.T, r reply) string {
	t.Helper()
	return decode[ErrorBody](t, r.body).Error.Message
}

// itoa formats an int.
func itoa(i int) string { return strconv.Itoa(i) }

// errorsAs is errors.As.
func errorsAs(err error, target any) bool { return errors.As(err, target) }
