package simworker

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const prompt = "the quick brown fox"

// format builds requests of one inference wire format.
type format struct {
	name string
	path string
	// build returns a request for text with max tokens and kv_transfer_params (nil: none).
	build func(text string, maxTokens int, kv obj) obj
}

var formats = []format{
	{"chat", PathChatCompletions, func(text string, n int, kv obj) obj {
		b := userChat(text, obj{"max_tokens": n})
		if kv != nil {
			b["kv_transfer_params"] = kv
		}
		return b
	}},
	{"completions", PathCompletions, func(text string, n int, kv obj) obj {
		b := completion(text, obj{"max_tokens": n})
		if kv != nil {
			b["kv_transfer_params"] = kv
		}
		return b
	}},
	{"generate", PathGenerate, func(text string, n int, kv obj) obj {
		sp := obj{"max_tokens": n}
		if kv != nil {
			sp["extra_args"] = obj{"kv_transfer_params": kv}
		}
		return generate(TokenizePrompt(text), sp, nil)
	}},
}

// kvOf extracts the top-level kv_transfer_params of a response.
func kvOf(t *testing.T, r reply) obj {
	t.Helper()
	return decode[struct {
		KV obj `json:"kv_transfer_params"`
	}](t, r.body).KV
}

// portOf returns the port of a worker's URL.
func portOf(t *testing.T, w *Worker) int {
	t.Helper()
	_, port, err := net.SplitHostPort(strings.TrimPrefix(w.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	var p int
	if err := json.Unmarshal([]byte(port), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPrefillDecodeNixl(t *testing.T) {
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			p := startWorker(t, Config{Role: RolePrefill, Name: "p0"})
			d := startWorker(t, Config{Role: RoleDecode, Name: "d0"})
			key := mustKey(t, f.path, f.build(prompt, 1, nil))
			wantTokens := len(TokenizePrompt(prompt))
			if f.name == "chat" {
				wantTokens++ // role token
			}

			// A conditional decode misses: 412, nothing cached.
			miss := post(t, d, f.path, f.build(prompt, 4, nil), "Prefer", "if-available")
			mustStatus(t, miss, 412)
			if e := decode[ErrorBody](t, miss.body).Error; e.Code != 412 || d.CacheHas(key) {
				t.Fatalf("412 body %s, cached %v", miss.body, d.CacheHas(key))
			}

			pr := post(t, p, f.path, f.build(prompt, 1, obj{"do_remote_decode": true, "do_remote_prefill": false}))
			mustStatus(t, pr, 200)
			kv := decode[struct {
				KV NixlKVParams `json:"kv_transfer_params"`
			}](t, pr.body).KV
			if !kv.DoRemotePrefill || kv.DoRemoteDecode || kv.RemoteEngineID != p.EngineID() || kv.RemoteRequestID == "" ||
				kv.RemoteHost != "127.0.0.1" || kv.RemotePort != portOf(t, p) || kv.TPSize != 1 ||
				kv.RemoteNumTokens != wantTokens || len(kv.RemoteBlockIDs) != 1 || len(kv.RemoteBlockIDs[0]) != 1 {
				t.Fatalf("kv_transfer_params = %+v", kv)
			}
			if !p.CacheHas(key) {
				t.Error("prefill did not cache its prompt")
			}
			h := decode[KVHandle](t, do(t, "GET", p.URL()+"/kv/"+kv.RemoteRequestID, nil, nil).body)
			if h.RemoteEngineID != kv.RemoteEngineID || h.PromptKey != key || h.NumTokens != wantTokens {
				t.Errorf("handle = %+v", h)
			}

			dr := post(t, d, f.path, f.build(prompt, 4, kvOf(t, pr)))
			mustStatus(t, dr, 200)
			if !d.CacheHas(key) {
				t.Fatal("verified transfer not cached")
			}
			// Now the conditional decode hits.
			mustStatus(t, post(t, d, f.path, f.build(prompt, 4, nil), "Prefer", "IF-AVAILABLE"), 200)
		})
	}
}

func TestDecodeNixlRejectsTamperedParams(t *testing.T) {
	p := startWorker(t, Config{Role: RolePrefill})
	d := startWorker(t, Config{Role: RoleDecode})
	pr := post(t, p, PathChatCompletions, userChat(prompt, obj{"max_tokens": 1, "kv_transfer_params": obj{"do_remote_decode": true}}))
	mustStatus(t, pr, 200)
	good := kvOf(t, pr)

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()

	tests := []struct {
		name    string
		mutate  func(kv obj)
		text    string
		wantMsg string
	}{
		{"engine id", func(kv obj) { kv["remote_engine_id"] = "other-engine" }, prompt, "remote_engine_id mismatch"},
		{"block ids", func(kv obj) { kv["remote_block_ids"] = [][]int{{999}} }, prompt, "remote_block_ids mismatch"},
		{"block ids type", func(kv obj) { kv["remote_block_ids"] = "x" }, prompt, "must be a list of lists"},
		{"request id", func(kv obj) { kv["remote_request_id"] = "nope" }, prompt, `"nope" unknown to`},
		{"missing host", func(kv obj) { delete(kv, "remote_host") }, prompt, "missing kv_transfer_params.remote_host"},
		{"bad port", func(kv obj) { kv["remote_port"] = 0 }, prompt, "not a valid port"},
		{"unreachable", func(kv obj) { kv["remote_port"] = deadPort }, prompt, "cannot reach peer"},
		{"other prompt", func(obj) {}, "a different prompt", "prompt mismatch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv := maps.Clone(good)
			tt.mutate(kv)
			r := post(t, d, PathChatCompletions, userChat(tt.text, obj{"max_tokens": 3, "kv_transfer_params": kv}))
			mustStatus(t, r, 400)
			if msg := errorMessage(t, r); !strings.HasPrefix(msg, "KV transfer failed: ") || !strings.Contains(msg, tt.wantMsg) {
				t.Errorf("message %q, want KV transfer failed: ...%s", msg, tt.wantMsg)
			}
			if d.CacheLen() != 0 {
				t.Error("failed transfer populated the cache")
			}
		})
	}
}

func TestRoleAcceptance(t *testing.T) {
	prefill := startWorker(t, Config{Role: RolePrefill})
	decodeW := startWorker(t, Config{Role: RoleDecode})
	both := startWorker(t, Config{Role: RoleBoth})
	leg := obj{"do_remote_decode": true}
	tests := []struct {
		name    string
		w       *Worker
		path    string
		body    obj
		status  int
		wantMsg string
		wantKV  bool
	}{
		{"prefill rejects local", prefill, PathChatCompletions, userChat(prompt, obj{"max_tokens": 1}), 400, "accepts only prefill legs", false},
		{"prefill rejects remote-prefill leg", prefill, PathCompletions, completion(prompt, obj{"max_tokens": 1, "kv_transfer_params": obj{"do_remote_prefill": true}}), 400, "accepts only prefill legs", false},
		{"prefill max_tokens 2", prefill, PathChatCompletions, userChat(prompt, obj{"max_tokens": 2, "kv_transfer_params": leg}), 400, "max_tokens must be 1", false},
		{"prefill max_completion_tokens", prefill, PathChatCompletions, userChat(prompt, obj{"max_tokens": 1, "max_completion_tokens": 3, "kv_transfer_params": leg}), 400, "max_completion_tokens must be 1", false},
		{"prefill no max_tokens", prefill, PathCompletions, completion(prompt, obj{"kv_transfer_params": leg}), 400, "max_tokens must be 1 for prefill requests, got none", false},
		{"prefill stream", prefill, PathChatCompletions, userChat(prompt, obj{"max_tokens": 1, "stream": true, "kv_transfer_params": leg}), 400, "stream must be false", false},
		{"prefill generate max", prefill, PathGenerate, generate([]int{1, 2}, obj{"max_tokens": 2, "extra_args": obj{"kv_transfer_params": leg}}, nil), 400, "sampling_params.max_tokens must be 1", false},
		{"prefill ok", prefill, PathChatCompletions, userChat(prompt, obj{"max_tokens": 1, "kv_transfer_params": leg}), 200, "", true},
		{"decode rejects prefill leg", decodeW, PathChatCompletions, userChat(prompt, obj{"max_tokens": 1, "kv_transfer_params": leg}), 400, "does not accept prefill legs", false},
		{"decode local", decodeW, PathChatCompletions, userChat(prompt, obj{"max_tokens": 3}), 200, "", false},
		{"both prefill leg", both, PathCompletions, completion(prompt, obj{"max_tokens": 1, "kv_transfer_params": leg}), 200, "", true},
		{"both local", both, PathGenerate, generate([]int{1, 2}, obj{"max_tokens": 3}, nil), 200, "", false},
		{"non-boolean flag", both, PathChatCompletions, userChat(prompt, obj{"kv_transfer_params": obj{"do_remote_decode": 1}}), 400, "must be a boolean", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, tt.w, tt.path, tt.body)
			mustStatus(t, r, tt.status)
			if tt.wantMsg != "" && !strings.Contains(errorMessage(t, r), tt.wantMsg) {
				t.Errorf("message %q, want %q", errorMessage(t, r), tt.wantMsg)
			}
			if tt.status == 200 {
				if hasKV := strings.Contains(string(r.body), `"kv_transfer_params"`); hasKV != tt.wantKV {
					t.Errorf("kv_transfer_params present = %v, want %v: %s", hasKV, tt.wantKV, r.body)
				}
			}
		})
	}
}

func TestPrefillDecodeSGLangShape(t *testing.T) {
	p := startWorker(t, Config{Role: RolePrefill, KVConnector: KVSGLang})
	d := startWorker(t, Config{Role: RoleDecode, KVConnector: KVSGLang})
	const room = "0b6a1d7e-5c7f-4f0e-9d8e-3c2b1a0f9e8d"
	tests := []struct {
		name    string
		w       *Worker
		kv      obj
		wantMsg string
	}{
		{"prefill missing port", p, obj{"do_remote_decode": true, "bootstrap_room": room}, "missing kv_transfer_params.bootstrap_port"},
		{"prefill string port", p, obj{"do_remote_decode": true, "bootstrap_port": "8998", "bootstrap_room": room}, "bootstrap_port must be an integer"},
		{"prefill missing room", p, obj{"do_remote_decode": true, "bootstrap_port": 8998}, "missing kv_transfer_params.bootstrap_room"},
		{"prefill negative room", p, obj{"do_remote_decode": true, "bootstrap_port": 8998, "bootstrap_room": -4}, "bootstrap_room must be a non-negative integer or a string"},
		{"prefill object room", p, obj{"do_remote_decode": true, "bootstrap_port": 8998, "bootstrap_room": obj{}}, "bootstrap_room must be"},
		{"decode missing host", d, obj{"do_remote_prefill": true, "bootstrap_port": 8998, "bootstrap_room": room}, "missing kv_transfer_params.bootstrap_host"},
		{"decode bad port", d, obj{"do_remote_prefill": true, "bootstrap_host": "h", "bootstrap_port": 70000, "bootstrap_room": room}, "not a valid port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := post(t, tt.w, PathCompletions, completion(prompt, obj{"max_tokens": 1, "kv_transfer_params": tt.kv}))
			mustStatus(t, r, 400)
			if !strings.Contains(errorMessage(t, r), tt.wantMsg) {
				t.Errorf("message %q, want %q", errorMessage(t, r), tt.wantMsg)
			}
		})
	}
	// A both-role worker has no disaggregation mode for SGLang's own fields.
	b := startWorker(t, Config{Role: RoleBoth, KVConnector: KVSGLang})
	r := post(t, b, PathCompletions, completion(prompt, obj{"max_tokens": 1, "bootstrap_room": 7, "bootstrap_port": 1}))
	mustStatus(t, r, 400)
}

// sglangPair starts an SGLang prefill and decode worker whose bootstrap waits last wait.
func sglangPair(t *testing.T, wait time.Duration) (p, d *Worker, port int) {
	p = startWorker(t, Config{Role: RolePrefill, KVConnector: KVSGLang, BootstrapTimeout: wait, BootstrapAddr: "127.0.0.1:0"})
	d = startWorker(t, Config{Role: RoleDecode, KVConnector: KVSGLang, BootstrapTimeout: wait})
	u, err := url.Parse(p.BootstrapURL())
	if err != nil {
		t.Fatal(err)
	}
	port, _ = strconv.Atoi(u.Port())
	return p, d, port
}

// The sequential path fails where SGLang's does: a prefill alone waits for its decode and times
// out, and so does a decode whose prefill never comes.
func TestSGLangSequentialTimesOut(t *testing.T) {
	p, d, port := sglangPair(t, 150*time.Millisecond)
	room := obj{"bootstrap_host": "127.0.0.1", "bootstrap_port": port}
	pre := post(t, p, PathCompletions, completion(prompt, withRoom(obj{"max_tokens": 1}, room, 11)))
	mustStatus(t, pre, 500)
	if msg := errorMessage(t, pre); !strings.Contains(msg, "KV transfer failed: bootstrap room 11: no decode joined within 150ms") {
		t.Errorf("prefill message %q", msg)
	}
	// The prefill has given up: a decode sent after it waits in an empty room.
	dec := post(t, d, PathCompletions, completion(prompt, withRoom(obj{"max_tokens": 3}, room, 11)))
	mustStatus(t, dec, 400)
	// (Whichever of the decode's own wait and the bootstrap server's runs out first says so.)
	if msg := errorMessage(t, dec); !strings.HasPrefix(msg, "KV transfer failed: ") || !strings.Contains(msg, "room 11") ||
		!strings.Contains(msg, "no prefill within 150ms") {
		t.Errorf("decode message %q", msg)
	}
	// The sequential connector's shape (the room in kv_transfer_params, no host) fails alike.
	seq := post(t, p, PathCompletions, completion(prompt, obj{"max_tokens": 1,
		"kv_transfer_params": obj{"do_remote_decode": true, "bootstrap_port": port, "bootstrap_room": "0b6a1d7e-5c7f-4f0e-9d8e-3c2b1a0f9e8d"}}))
	mustStatus(t, seq, 500)
	if p.OpenBootstrapRooms() != 0 || d.OpenBootstrapRooms() != 0 {
		t.Errorf("rooms left open: prefill %d decode %d", p.OpenBootstrapRooms(), d.OpenBootstrapRooms())
	}
}

// withRoom returns body with SGLang's top-level bootstrap fields and bootstrap_room n.
func withRoom(body, fields obj, n int) obj {
	for k, v := range fields {
		body[k] = v
	}
	body["bootstrap_room"] = n
	return body
}

// Sent together, in either order, prefill and decode meet in their room and both succeed.
func TestSGLangConcurrent(t *testing.T) {
	p, d, port := sglangPair(t, 10*time.Second)
	for i, decodeFirst := range []bool{false, true} {
		room := obj{"bootstrap_host": "127.0.0.1", "bootstrap_port": port}
		n := 100 + i
		var wg sync.WaitGroup
		var pre reply
		wg.Add(1)
		prefill := func() {
			defer wg.Done()
			pre = post(t, p, PathChatCompletions, userChat(prompt, withRoom(obj{"max_tokens": 1}, room, n)))
		}
		if !decodeFirst {
			go prefill()
			if _, err := p.AwaitRequests(context.Background(), func(r []Request) bool { return len(r) == i+1 }); err != nil {
				t.Fatal(err)
			}
		}
		done := make(chan reply, 1)
		go func() {
			done <- post(t, d, PathChatCompletions, userChat(prompt, withRoom(obj{"max_tokens": 3}, room, n)))
		}()
		if decodeFirst {
			if _, err := d.AwaitRequests(context.Background(), func(r []Request) bool { return len(r) == i+1 }); err != nil {
				t.Fatal(err)
			}
			go prefill()
		}
		dec := <-done
		wg.Wait()
		mustStatus(t, pre, 200)
		mustStatus(t, dec, 200)
		kv := decode[struct {
			KV obj `json:"kv_transfer_params"`
		}](t, pre.body).KV
		if kv["bootstrap_host"] != "127.0.0.1" || kv["bootstrap_port"] != float64(port) || kv["bootstrap_room"] != float64(n) {
			t.Errorf("prefill answered %v", kv)
		}
		if got := decode[ChatCompletion](t, dec.body).Choices[0].Message.Content; got != "the quick brown" {
			t.Errorf("decode answered %q", got)
		}
	}
	// A decode whose room holds another prompt's KV refuses it.
	room := obj{"bootstrap_host": "127.0.0.1", "bootstrap_port": port}
	go post(t, p, PathChatCompletions, userChat("another prompt", withRoom(obj{"max_tokens": 1}, room, 7)))
	dec := post(t, d, PathChatCompletions, userChat(prompt, withRoom(obj{"max_tokens": 3}, room, 7)))
	mustStatus(t, dec, 400)
	if msg := errorMessage(t, dec); !strings.Contains(msg, "prompt mismatch") {
		t.Errorf("decode message %q", msg)
	}
}

// A decode waiting for its prefill fails as soon as the prefill worker dies.
func TestSGLangDecodeFailsWhenPrefillDies(t *testing.T) {
	p, d, port := sglangPair(t, time.Minute)
	done := make(chan reply, 1)
	go func() {
		done <- post(t, d, PathChatCompletions, userChat(prompt, withRoom(obj{"max_tokens": 3}, obj{"bootstrap_host": "127.0.0.1", "bootstrap_port": port}, 5)))
	}()
	// The decode has joined the room on the prefill's bootstrap server: kill the prefill.
	for p.OpenBootstrapRooms() == 0 {
		runtime.Gosched()
	}
	p.Kill()
	dec := <-done
	mustStatus(t, dec, 400)
	if msg := errorMessage(t, dec); !strings.Contains(msg, "KV transfer failed: cannot reach the bootstrap server") {
		t.Errorf("decode message %q", msg)
	}
}

func TestPrefillDecodeSharedStorage(t *testing.T) {
	dir := t.TempDir()
	p := startWorker(t, Config{Role: RolePrefill, KVConnector: KVSharedStorage, KVDir: dir})
	d := startWorker(t, Config{Role: RoleDecode, KVConnector: KVSharedStorage, KVDir: dir})
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			text := prompt + " " + f.name
			key := mustKey(t, f.path, f.build(text, 1, nil))
			r := post(t, p, f.path, f.build(text, 1, obj{"do_remote_decode": true}))
			mustStatus(t, r, 200)
			if strings.Contains(string(r.body), "kv_transfer_params") {
				t.Errorf("shared-storage prefill answered kv_transfer_params: %s", r.body)
			}
			b, err := os.ReadFile(filepath.Join(dir, key))
			if err != nil || !strings.Contains(string(b), key) {
				t.Fatalf("KV file: %v %s", err, b)
			}
			mustStatus(t, post(t, d, f.path, f.build(text, 3, obj{"do_remote_prefill": true})), 200)
			if !d.CacheHas(key) {
				t.Error("transfer not cached")
			}
			miss := post(t, d, f.path, f.build(text+" unseen", 3, obj{"do_remote_prefill": true}))
			mustStatus(t, miss, 400)
			if msg := errorMessage(t, miss); !strings.Contains(msg, "KV transfer failed: no KV file") {
				t.Errorf("message %q", msg)
			}
		})
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Errorf("temporary file left behind: %s", e.Name())
		}
	}
}

func TestConditionalDecodeLRU(t *testing.T) {
	d := startWorker(t, Config{Role: RoleDecode, CacheSize: 1})
	a, b := userChat("prompt a", obj{"max_tokens": 1}), userChat("prompt b", obj{"max_tokens": 1})
	mustStatus(t, post(t, d, PathChatCompletions, a, "Prefer", "if-available"), 412)
	mustStatus(t, post(t, d, PathChatCompletions, a), 200)
	mustStatus(t, post(t, d, PathChatCompletions, a, "Prefer", "if-available"), 200)
	mustStatus(t, post(t, d, PathChatCompletions, b), 200) // evicts a
	mustStatus(t, post(t, d, PathChatCompletions, a, "Prefer", "if-available"), 412)
	mustStatus(t, post(t, d, PathChatCompletions, b, "Prefer", "respond-async, if-available"), 200)
	reqs := d.Requests()
	if got := reqs[len(reqs)-2].Status; got != 412 {
		t.Errorf("recorded status %d, want 412", got)
	}
}

// A room name is bounded, as SGLang's integer rooms are.
func TestSGLangRoomNameBounded(t *testing.T) {
	p := startWorker(t, Config{Role: RolePrefill, KVConnector: KVSGLang})
	r := post(t, p, PathBootstrap+strings.Repeat("r", 65), nil)
	mustStatus(t, r, 400)
	if p.OpenBootstrapRooms() != 0 {
		t.Fatal("a room was opened")
	}
}
