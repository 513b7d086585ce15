package bench

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/doubles/simworker"
)

func startWorker(t *testing.T, cfg simworker.Config) *simworker.Worker {
	t.Helper()
	cfg.DisableRecording = true
	w, err := simworker.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// TestLoadAgainstWorker drives a real simworker briefly in both modes: every answer must pass.
func TestLoadAgainstWorker(t *testing.T) {
	w := startWorker(t, simworker.Config{})
	body := Bodies()[Body200B]
	for _, stream := range []bool{false, true} {
		l := NewLoad(Cell{TargetDirect, Body200B, stream}, w.URL(), body.Payload(stream), LoadOptions{Concurrency: 2, Timeout: 5 * time.Second})
		l.Warmup(context.Background(), 50*time.Millisecond)
		l.Measure(context.Background(), 100*time.Millisecond)
		l.Measure(context.Background(), 100*time.Millisecond)
		l.Close()
		r := l.Result()
		if r.Errors != 0 || r.Requests == 0 || r.RPS <= 0 || r.P50 <= 0 || r.P99 < r.P50 || r.Elapsed != 200*time.Millisecond || l.Served() < r.Requests {
			t.Errorf("stream=%v: %+v", stream, r)
		}
	}
}

// TestLoadCountsBrokenAnswers checks that truncated streams and errors are counted, not measured.
func TestLoadCountsBrokenAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.Contains(r.Header.Get("X-Vegeta-Seq"), "1") {
			http.Error(w, "nope", http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // cut the stream
	}))
	defer srv.Close()
	l := NewLoad(Cell{TargetRaw, Body200B, true}, srv.URL, []byte(`{}`), LoadOptions{Concurrency: 2, Timeout: 5 * time.Second})
	defer l.Close()
	l.Measure(context.Background(), 100*time.Millisecond)
	r := l.Result()
	if r.Requests != 0 || r.Errors == 0 || r.ErrorSample == "" || r.RPS != 0 {
		t.Errorf("%+v", r)
	}
}

func TestRampFor(t *testing.T) {
	for p50, want := range map[time.Duration]time.Duration{0: 200 * time.Millisecond, 2 * time.Millisecond: 200 * time.Millisecond,
		300 * time.Millisecond: 600 * time.Millisecond, 5 * time.Second: 2 * time.Second} {
		if got := RampFor(p50); got != want {
			t.Errorf("RampFor(%v) = %v, want %v", p50, got, want)
		}
	}
}

func TestSSELoadAgainstStampingWorker(t *testing.T) {
	w := startWorker(t, simworker.Config{StampEvents: true, ITL: time.Millisecond})
	payload := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"a b c"}],"max_tokens":4,"stream":true}`)
	l := NewSSELoad(TargetDirect, w.URL(), SSEOptions{Concurrency: 2, Payload: payload, Timeout: 5 * time.Second})
	defer l.Close()
	l.Run(context.Background(), 20*time.Millisecond, false)
	l.Run(context.Background(), 100*time.Millisecond, true)
	r := l.Result()
	// Each stream: the role event, 4 tokens and [DONE], all stamped.
	if r.Errors != 0 || r.Streams == 0 || r.Events != r.Streams*6 || r.P50 <= 0 || r.P99 < r.P50 {
		t.Errorf("%+v", r)
	}

	// A worker that does not stamp fails every stream.
	plain := startWorker(t, simworker.Config{})
	l2 := NewSSELoad(TargetDirect, plain.URL(), SSEOptions{Concurrency: 1, Payload: payload, Timeout: 5 * time.Second})
	defer l2.Close()
	l2.Run(context.Background(), 20*time.Millisecond, true)
	if r := l2.Result(); r.Errors == 0 || r.Events != 0 || !strings.Contains(r.ErrorSample, "stamp") {
		t.Errorf("%+v", r)
	}
}
