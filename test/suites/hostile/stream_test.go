//go:build linux

package hostile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// hostileStream is a gateway whose every streamed chat answer is one ordinary event, then an
// event of size bytes (ended by its blank line when ended), then nothing. It counts its legs and
// the bytes of the huge events the coordinator took before it hung up.
func hostileStream(t *testing.T, size int, ended bool) (url string, legs, taken *atomic.Int64) {
	t.Helper()
	legs, taken = &atomic.Int64{}, &atomic.Int64{}
	huge := []byte("data: " + strings.Repeat("x", size))
	if ended {
		huge = append(huge, "\n\n"...)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		legs.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}`+"\n\n")
		w.(http.Flusher).Flush()
		for rest := huge; len(rest) > 0; {
			n, err := w.Write(rest[:min(64<<10, len(rest))])
			taken.Add(int64(n))
			if err != nil {
				return // the coordinator stopped reading at its limit and hung up
			}
			rest = rest[n:]
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, legs, taken
}

// procCPU is the process's user+system CPU so far (/proc/<pid>/stat).
func (c *coordinator) procCPU(t *testing.T) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc stat: %q", data)
	}
	const ticks = 100 // USER_HZ
	return time.Duration(ut+st) * time.Second / ticks
}

// resetPeak resets the process's resident-set high-water mark (VmHWM) to its resident set.
func (c *coordinator) resetPeak(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", c.Cmd.Process.Pid), []byte("5"), 0); err != nil {
		t.Fatalf("resetting the peak RSS: %v", err)
	}
}

// TestWorkerEventOverLimit: a worker whose stream's second event is 2 MiB (twice the default
// gateway.max_event_size), with or without its blank line, or 64 MiB. The coordinator reads it up
// to the limit, never past, and treats it as a worker fault: the stream is resumed on another
// pick (chat streams are) and, every pick answering the same, after max_resumes (2) the client
// gets an error event naming the key. It costs the process a few tens of milliseconds of CPU and
// a few MiB whatever the event's size; nothing is kept after the request.
func TestWorkerEventOverLimit(t *testing.T) {
	for name, tc := range map[string]struct {
		size  int
		ended bool
	}{
		"2 MiB, no blank line":  {size: 2 * mib},
		"2 MiB, its blank line": {size: 2 * mib, ended: true},
		"64 MiB, no blank line": {size: 64 * mib},
	} {
		t.Run(name, func(t *testing.T) {
			gw, legs, taken := hostileStream(t, tc.size, tc.ended)
			co := startCoordinator(t, gw, config{})
			body, _ := json.Marshal(map[string]any{"model": "sim-model", "stream": true, "max_tokens": 100,
				"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
			co.resetPeak(t)
			rss, cpu := co.memory(t, "VmRSS"), co.procCPU(t)
			resp, err := client.Post(co.url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			got, rerr := io.ReadAll(resp.Body) // the coordinator aborts the body after the error event
			resp.Body.Close()
			spent, peak := co.procCPU(t)-cpu, co.memory(t, "VmHWM")-rss
			t.Logf("%d legs, %.1f MiB of huge events taken, HTTP %d, %d bytes to the client (read error %v); CPU %v, peak RSS +%.1f MiB",
				legs.Load(), float64(taken.Load())/mib, resp.StatusCode, len(got), rerr, spent, float64(peak)/mib)

			if resp.StatusCode != http.StatusOK || legs.Load() != 3 {
				t.Fatalf("HTTP %d after %d legs, want a stream resumed twice (3 legs)", resp.StatusCode, legs.Load())
			}
			events := strings.Split(strings.TrimSuffix(string(got), "\n\n"), "\n\n")
			last := events[len(events)-1]
			for _, ev := range events[:len(events)-1] {
				if !strings.Contains(ev, `"content":"Hello"`) {
					t.Fatalf("the client got %.200q before the error event, want only the Hello of each pick", ev)
				}
			}
			var e apiError
			if len(events) != 4 || json.Unmarshal([]byte(strings.TrimPrefix(last, "data: ")), &e) != nil ||
				!strings.Contains(e.Error.Message, "over gateway.max_event_size (1048576 bytes)") || string(e.Error.Code) != `"stream_interrupted"` {
				t.Fatalf("%d events, the last %.300q: want three Hello then an error event naming gateway.max_event_size", len(events), last)
			}
			if spent > 500*time.Millisecond {
				t.Errorf("the coordinator spent %v of CPU on three huge events", spent)
			}
			if taken.Load() > 3*(mib+8*mib) { // the limit, and what the sockets buffer between the two
				t.Errorf("%.1f MiB of the huge events taken: the reads did not stop at the limit", float64(taken.Load())/mib)
			}
			// Each attempt holds at most the 1 MiB limit; the rest is the garbage collector's slack
			// (before the limit, the 64 MiB events cost +80 MiB and 1 s of CPU).
			if peak > 12*mib {
				t.Errorf("peak RSS grew by %.1f MiB, want the 1 MiB limit and a few MiB", float64(peak)/mib)
			}
			if m := co.metrics(t); !strings.Contains(m, "\ncoordinator_resume_held_bytes 0\n") {
				t.Errorf("the streams' resume state is still held after the request: %s", metricLine(m, "coordinator_resume_held_bytes"))
			}
		})
	}
}

// metricLine is the line of /metrics text m that starts with name ("" when none).
func metricLine(m, name string) string {
	for line := range strings.SplitSeq(m, "\n") {
		if strings.HasPrefix(line, name+" ") {
			return line
		}
	}
	return ""
}
