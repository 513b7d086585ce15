package simworker

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestWorkerBasics(t *testing.T) {
	w := startWorker(t, Config{Name: "w1", ModelName: "my-model"})
	if !strings.HasPrefix(w.URL(), "http://127.0.0.1:") {
		t.Fatalf("URL = %q", w.URL())
	}
	tests := []struct {
		name       string
		method     string
		path       string
		wantStatus int
		wantBody   string
	}{
		{"health", http.MethodGet, "/health", 200, ""},
		{"models", http.MethodGet, "/v1/models", 200, `"data":[{"id":"my-model","object":"model"`},
		{"models list object", http.MethodGet, "/v1/models", 200, `"object":"list"`},
		{"unknown route", http.MethodGet, "/nope", 404, `"type":"NotFoundError"`},
		{"unknown kv handle", http.MethodGet, "/kv/none", 404, `unknown remote_request_id`},
		{"unknown ec handle", http.MethodGet, "/ec/none", 404, `unknown mm_hash`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, tt.method, w.URL()+tt.path, nil, nil)
			mustStatus(t, r, tt.wantStatus)
			if !strings.Contains(string(r.body), tt.wantBody) {
				t.Errorf("body %s does not contain %s", r.body, tt.wantBody)
			}
		})
	}
}

func TestWorkerRecordsRequests(t *testing.T) {
	w := startWorker(t, Config{})
	body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`
	r := post(t, w, PathChatCompletions+"?x=1", body, "X-Request-Id", "rid-1", "Authorization", "Bearer k")
	mustStatus(t, r, 200)
	if got := r.header.Get("X-Request-Id"); got != "rid-1" {
		t.Errorf("X-Request-Id echo = %q", got)
	}
	if id := decode[ChatCompletion](t, r.body).ID; id != "chatcmpl-rid-1" {
		t.Errorf("id = %q, want chatcmpl-rid-1", id)
	}
	do(t, http.MethodGet, w.URL()+"/health", nil, nil)
	reqs := w.Requests()
	if len(reqs) != 2 {
		t.Fatalf("recorded %d requests, want 2", len(reqs))
	}
	got := reqs[0]
	if got.Method != http.MethodPost || got.Path != PathChatCompletions || got.Query != "x=1" || string(got.Body) != body ||
		got.Header.Get("Authorization") != "Bearer k" || got.Status != 200 || got.Time.IsZero() {
		t.Errorf("recorded %+v", got)
	}
	reqs[0].Header.Set("Authorization", "changed")
	if w.Requests()[0].Header.Get("Authorization") != "Bearer k" {
		t.Error("Requests returned a shared header map")
	}
	w.Reset()
	if n := len(w.Requests()); n != 0 {
		t.Errorf("after Reset %d requests", n)
	}
}

func TestWorkerFailNext(t *testing.T) {
	w := startWorker(t, Config{})
	chat := userChat("hi", obj{"max_tokens": 1})
	tests := []struct {
		name       string
		status     int
		body       string
		wantCT     string
		wantInBody string
	}{
		{"default body", 503, "", "application/json", `"code":503`},
		{"json body", 500, `{"error":"boom"}`, "application/json", `{"error":"boom"}`},
		{"text body", 429, "slow down", "text/plain; charset=utf-8", "slow down"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w.FailNext(2, tt.status, tt.body)
			// Side channels and GETs do not consume failures.
			mustStatus(t, do(t, http.MethodGet, w.URL()+"/health", nil, nil), 200)
			for range 2 {
				r := post(t, w, PathChatCompletions, chat)
				mustStatus(t, r, tt.status)
				if ct := r.header.Get("Content-Type"); ct != tt.wantCT {
					t.Errorf("Content-Type %q, want %q", ct, tt.wantCT)
				}
				if !strings.Contains(string(r.body), tt.wantInBody) {
					t.Errorf("body %s", r.body)
				}
			}
			mustStatus(t, post(t, w, PathChatCompletions, chat), 200)
		})
	}
	w.FailNext(1, 500, "")
	mustStatus(t, post(t, w, PathChatRender, chat), 500)
	w.FailNext(5, 500, "")
	w.Reset()
	mustStatus(t, post(t, w, PathChatCompletions, chat), 200)
}

func TestWorkerMisconfigured(t *testing.T) {
	if _, err := Start(Config{Role: "nope"}); err == nil {
		t.Fatal("Start accepted an invalid config")
	}
	srv := httptest.NewServer(New(Config{Role: RolePrefill, KVConnector: KVSharedStorage}))
	defer srv.Close()
	r := do(t, http.MethodPost, srv.URL+PathCompletions, completion("a", nil), nil)
	mustStatus(t, r, 500)
	if !strings.Contains(errorMessage(t, r), "KVDir is required") {
		t.Errorf("message %q", errorMessage(t, r))
	}
}

func TestWorkerAsHandler(t *testing.T) {
	// A worker mounted on httptest advertises the port it was reached on.
	w := New(Config{Role: RolePrefill})
	srv := httptest.NewServer(w)
	defer srv.Close()
	defer w.Close()
	if w.URL() != "" {
		t.Errorf("URL of an unstarted worker = %q", w.URL())
	}
	r := do(t, http.MethodPost, srv.URL+PathCompletions,
		completion("a b", obj{"max_tokens": 1, "kv_transfer_params": obj{"do_remote_decode": true}}), nil)
	mustStatus(t, r, 200)
	kv := decode[struct {
		KV NixlKVParams `json:"kv_transfer_params"`
	}](t, r.body).KV
	if want := srv.Listener.Addr().String(); kv.RemoteHost+":"+itoa(kv.RemotePort) != want {
		t.Errorf("advertised %s:%d, want %s", kv.RemoteHost, kv.RemotePort, want)
	}
}

func TestWorkerCloseIdempotent(t *testing.T) {
	w, err := Start(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestWorkerBodyTooLarge(t *testing.T) {
	w := startWorker(t, Config{})
	big := `{"prompt":"` + strings.Repeat("a", maxBodyBytes) + `"}`
	mustStatus(t, post(t, w, PathCompletions, big), http.StatusRequestEntityTooLarge)
}
