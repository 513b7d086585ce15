//go:build linux

package hostile

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestMessagesContentBlocks: a /v1/messages request of 4 MiB of tiny text blocks (~155K, over
// the default server.max_content_blocks of 10000) is refused with a 400 naming the first block
// over the limit and the key, nothing is forwarded, and refusing it costs about reading it.
func TestMessagesContentBlocks(t *testing.T) {
	st := startStack(t)
	rec := startRecorder(t, st.Gateway.URL())
	co := startCoordinator(t, rec.url, config{})
	var b bytes.Buffer
	b.WriteString(`{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":[`)
	for i := 0; b.Len() < 4*mib; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"type":"text","text":"x"}`)
	}
	b.WriteString(`]}]}`)
	co.resetPeak(t)
	rss, cpu := co.memory(t, "VmRSS"), co.procCPU(t)
	r := do(t, http.MethodPost, co.url+"/v1/messages", b.Bytes(), nil)
	spent, peak := co.procCPU(t)-cpu, co.memory(t, "VmHWM")-rss
	t.Logf("HTTP %d, CPU %v, peak RSS +%.1f MiB for %.1f MiB", r.status, spent, float64(peak)/mib, float64(b.Len())/mib)
	if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), `"type":"invalid_request_error"`) ||
		!strings.Contains(string(r.body), "messages[0].content[10000]: more than 10000 content blocks in the request (server.max_content_blocks)") {
		t.Fatalf("HTTP %d %.300s, want a 400 naming the block and server.max_content_blocks", r.status, r.body)
	}
	if legs := rec.taken(); len(legs) > 0 {
		t.Errorf("a refused request reached the gateway: %s %s", legs[0].method, legs[0].uri)
	}
	if peak > 2*int64(b.Len())+8*mib || spent > 500*time.Millisecond { // the body read, and the first 10000 blocks
		t.Errorf("refusing it cost +%.1f MiB and %v of CPU", float64(peak)/mib, spent)
	}
}
