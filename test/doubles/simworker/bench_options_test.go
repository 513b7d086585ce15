package simworker

import (
	"io"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStampEvents(t *testing.T) {
	w := startWorker(t, Config{StampEvents: true})
	before := time.Now().UnixNano()
	resp, err := testClient.Post(w.URL()+PathChatCompletions, "application/json",
		strings.NewReader(string(mustJSON(t, userChat("x y", obj{"stream": true, "max_tokens": 2})))))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now().UnixNano()
	events := strings.Split(strings.TrimSuffix(string(raw), "\n\n"), "\n\n")
	if len(events) != 1+2+1 { // role, 2 tokens, [DONE]
		t.Fatalf("events %q", events)
	}
	var last int64
	for i, ev := range events {
		stamp, data, ok := strings.Cut(ev, "\n")
		ns, ok2 := strings.CutPrefix(stamp, EventStampPrefix)
		if !ok || !ok2 || !strings.HasPrefix(data, "data: ") {
			t.Fatalf("event %d = %q, want a stamp comment then data", i, ev)
		}
		v, err := strconv.ParseInt(ns, 10, 64)
		if err != nil || v < before || v > after || v < last {
			t.Errorf("event %d stamp %q not within [%d, %d] and after %d", i, ns, before, after, last)
		}
		last = v
	}
	if events[3] != EventStampPrefix+strconv.FormatInt(last, 10)+"\ndata: [DONE]" {
		t.Errorf("last event %q", events[3])
	}

	// Without the option the stream carries no comments.
	plain := startWorker(t, Config{})
	resp2, err := testClient.Post(plain.URL()+PathChatCompletions, "application/json",
		strings.NewReader(string(mustJSON(t, userChat("x y", obj{"stream": true, "max_tokens": 2})))))
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	if n := len(sseEvents(t, resp2.Body)); n != 4 {
		t.Errorf("%d events", n)
	}
}

func TestDisableRecording(t *testing.T) {
	w := startWorker(t, Config{DisableRecording: true})
	r := post(t, w, PathChatCompletions, `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)
	mustStatus(t, r, 200)
	w.FailNext(1, 503, "")
	mustStatus(t, post(t, w, PathChatCompletions, `{"messages":[{"role":"user","content":"hi"}]}`), 503)
	if n := len(w.Requests()); n != 0 {
		t.Errorf("recorded %d requests, want none", n)
	}
}
