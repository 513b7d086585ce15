package simworker

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// The checks a vLLM server makes that the worker mirrors (see "Differences from vLLM" in doc.go
// for those it does not).

func TestStreamOptionsRequireStream(t *testing.T) {
	w := startWorker(t, Config{})
	const refused = `{"error":{"message":"Stream options can only be defined when ` + "`stream=True`" +
		`.","type":"BadRequestError","param":"stream_options","code":400}}`
	usage := obj{"include_usage": true}
	tests := []struct {
		name   string
		path   string
		body   obj
		status int
	}{
		{"chat stream false", PathChatCompletions, userChat(prompt, obj{"stream": false, "stream_options": usage}), 400},
		{"chat stream absent", PathChatCompletions, userChat(prompt, obj{"stream_options": usage}), 400},
		{"chat stream null", PathChatCompletions, userChat(prompt, obj{"stream": nil, "stream_options": obj{"continuous_usage_stats": false}}), 400},
		{"completions stream false", PathCompletions, completion(prompt, obj{"stream": false, "stream_options": usage}), 400},
		{"chat streaming", PathChatCompletions, userChat(prompt, obj{"stream": true, "stream_options": usage}), 200},
		{"completions streaming", PathCompletions, completion(prompt, obj{"stream": true, "stream_options": usage}), 200},
		// vLLM's validator tests the value's truth: an empty or null stream_options passes.
		{"chat empty options", PathChatCompletions, userChat(prompt, obj{"stream_options": obj{}}), 200},
		{"chat null options", PathChatCompletions, userChat(prompt, obj{"stream": false, "stream_options": nil}), 200},
		// The generate endpoint has no such validator.
		{"generate", PathGenerate, generate([]int{1, 2}, obj{"max_tokens": 2}, obj{"stream_options": usage}), 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, w, tt.path, tt.body)
			mustStatus(t, r, tt.status)
			if tt.status == 400 && string(r.body) != refused {
				t.Errorf("body %s, want %s", r.body, refused)
			}
		})
	}
}

func TestUnknownModel(t *testing.T) {
	w := startWorker(t, Config{ModelName: "served-model"})
	enc := startWorker(t, Config{Role: RoleEncode, ModelName: "served-model"})
	// named returns b naming model; a nil model removes the member.
	named := func(model any, b obj) obj {
		b["model"] = model
		if model == nil {
			delete(b, "model")
		}
		return b
	}
	tests := []struct {
		name   string
		w      *Worker
		path   string
		body   obj
		status int
	}{
		{"chat other", w, PathChatCompletions, named("sim-model", userChat(prompt, nil)), 404},
		{"completions other", w, PathCompletions, named("gpt-4o", completion(prompt, nil)), 404},
		{"generate other", w, PathGenerate, named("m", generate([]int{1, 2}, obj{"max_tokens": 1}, nil)), 404},
		{"streamed chat other", w, PathChatCompletions, named("Served-Model", userChat(prompt, obj{"stream": true})), 404},
		{"prefill leg other", w, PathChatCompletions,
			named("x", userChat(prompt, obj{"max_tokens": 1, "kv_transfer_params": obj{"do_remote_decode": true}})), 404},
		{"encode other", enc, PathChatCompletions, named("x", encodeChat(t, enc, []byte("img"), nil)), 404},
		{"served", w, PathChatCompletions, named("served-model", userChat(prompt, nil)), 200},
		{"absent", w, PathCompletions, named(nil, completion(prompt, nil)), 200},
		{"empty", w, PathChatCompletions, named("", userChat(prompt, nil)), 200},
		{"null", w, PathGenerate, generate([]int{1, 2}, obj{"max_tokens": 1}, obj{"model": nil}), 200},
		{"encode served", enc, PathChatCompletions, named("served-model", encodeChat(t, enc, []byte("img"), nil)), 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, tt.w, tt.path, tt.body)
			mustStatus(t, r, tt.status)
			if tt.status == 404 {
				want := `{"error":{"message":"The model ` + "`" + tt.body["model"].(string) + "`" +
					` does not exist.","type":"NotFoundError","param":"model","code":404}}`
				if string(r.body) != want {
					t.Errorf("body %s, want %s", r.body, want)
				}
				return
			}
			// An answer names the served model.
			if tt.w == w && !strings.Contains(string(r.body), `"model":"served-model"`) {
				t.Errorf("answer does not name the served model: %s", r.body)
			}
		})
	}
	// The render service takes any model (see doc.go).
	mustStatus(t, post(t, w, PathChatRender, obj{"model": "other", "messages": []obj{{"role": "user", "content": "hi"}}}), 200)
}

func TestNixlHandleIsPulledOnce(t *testing.T) {
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			p := startWorker(t, Config{Role: RolePrefill})
			d := startWorker(t, Config{Role: RoleDecode})
			pr := post(t, p, f.path, f.build(prompt, 1, obj{"do_remote_decode": true}))
			mustStatus(t, pr, 200)
			kv := kvOf(t, pr)
			id := kv["remote_request_id"].(string)
			dec := f.build(prompt, 2, kv)
			mustStatus(t, post(t, d, f.path, dec), 200)

			// A replayed or retried decode finds the blocks freed.
			d.ClearCache()
			again := post(t, d, f.path, dec)
			mustStatus(t, again, 400)
			if msg := errorMessage(t, again); !strings.HasPrefix(msg, "KV transfer failed: ") ||
				!strings.Contains(msg, `remote_request_id "`+id+`" was already pulled from 127.0.0.1:`) {
				t.Errorf("message %q", msg)
			}
			if d.CacheLen() != 0 {
				t.Error("the failed pull populated the cache")
			}
			// The side channel says so too; an id never published stays unknown.
			for _, c := range []struct {
				method, id string
				status     int
				msg        string
			}{
				{http.MethodGet, id, 410, "was already transferred"},
				{http.MethodDelete, id, 410, "was already transferred"},
				{http.MethodDelete, "never", 404, "unknown remote_request_id"},
			} {
				r := do(t, c.method, p.URL()+"/kv/"+c.id, nil, nil)
				mustStatus(t, r, c.status)
				if !strings.Contains(errorMessage(t, r), c.msg) {
					t.Errorf("%s /kv/%s: %s", c.method, c.id, r.body)
				}
			}
		})
	}
}

func TestNixlConcurrentPullsOneWins(t *testing.T) {
	p := startWorker(t, Config{Role: RolePrefill})
	d := startWorker(t, Config{Role: RoleDecode})
	pr := post(t, p, PathChatCompletions, userChat(prompt, obj{"max_tokens": 1, "kv_transfer_params": obj{"do_remote_decode": true}}))
	mustStatus(t, pr, 200)
	dec := userChat(prompt, obj{"max_tokens": 2, "kv_transfer_params": kvOf(t, pr)})
	body := mustJSON(t, dec)
	const n = 4
	statuses := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// do fails the test with t.Fatalf, which a goroutine must not call.
			resp, err := testClient.Post(d.URL()+PathChatCompletions, "application/json", bytes.NewReader(body))
			if err != nil {
				t.Error(err)
				statuses <- 0
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(statuses)
	counts := map[int]int{}
	for s := range statuses {
		counts[s]++
	}
	if counts[200] != 1 || counts[400] != n-1 {
		t.Fatalf("statuses %v, want one 200 and %d 400", counts, n-1)
	}
}
