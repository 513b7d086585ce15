//go:build linux

package hostile

import (
	"bytes"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// metricsBound is the largest /metrics the label attack may leave behind.
const metricsBound = 256 << 10

func TestModelLabelAbuse(t *testing.T) {
	st := startStack(t)
	co := startCoordinator(t, st.Gateway.URL(), config{})
	if r := do(t, http.MethodPost, co.url+"/v1/chat/completions", chat("sim-model"), nil); r.status != http.StatusOK {
		t.Fatalf("a real model: HTTP %d %s", r.status, r.body)
	}
	before := len(co.metrics(t))
	stop := ordinary(t, co.url)

	attacks := map[string]struct {
		n    int
		name func(i int) []byte
	}{
		"4 MiB names":      {n: 12, name: func(i int) []byte { return bytes.Repeat([]byte{'a' + byte(i%26)}, 4*mib) }},
		"1 MiB names":      {n: 10, name: func(i int) []byte { return fmt.Appendf(bytes.Repeat([]byte{'m'}, mib), "%d", i) }},
		"invalid UTF-8":    {n: 20, name: func(i int) []byte { return fmt.Appendf([]byte("bad-\xff\xfe-"), "%d", i) }},
		"3,000 junk names": {n: 3000, name: func(i int) []byte { return fmt.Appendf(nil, "junk-%d", i) }},
	}
	for name, a := range attacks {
		t.Run(name, func(t *testing.T) {
			var wg sync.WaitGroup
			sem := make(chan struct{}, 8)
			statuses := make([]int, a.n)
			for i := range a.n {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					body := append(append([]byte(`{"model":"`), a.name(i)...), `","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`...)
					r := do(t, http.MethodPost, co.url+"/v1/chat/completions", body, nil)
					statuses[i] = r.status
					if r.status != http.StatusOK {
						r.jsonError(t)
					}
				})
			}
			wg.Wait()
			for i, s := range statuses {
				if s == http.StatusOK || s >= 500 {
					t.Fatalf("request %d: HTTP %d, want the worker's 4xx for an unknown model", i, s)
				}
			}
		})
	}
	served, failures := stop()
	if len(failures) > 0 || served == 0 {
		t.Errorf("ordinary requests during the attack: %d served, failures %v", served, failures)
	}

	m := co.metrics(t)
	t.Logf("/metrics %d B before, %d B after; peak RSS %d MiB; %d ordinary requests served", before, len(m), co.peakRSS(t)/mib, served)
	if len(m) > metricsBound {
		t.Errorf("/metrics grew to %d bytes", len(m))
	}
	models := map[string]bool{}
	for _, match := range regexp.MustCompile(`coordinator_requests_total\{[^}]*model="([^"]*)"`).FindAllStringSubmatch(m, -1) {
		models[match[1]] = true
	}
	if !models["sim-model"] {
		t.Errorf("the served model lost its label: %v", models)
	}
	for model := range models {
		if strings.HasPrefix(model, "junk-") || strings.HasPrefix(model, "bad-") || len(model) > 128 {
			t.Errorf("an attacker's model name became a label: %.60q", model)
		}
	}
	if peak := co.peakRSS(t); peak > rssBound {
		t.Errorf("peak RSS %d MiB is over %d MiB", peak/mib, rssBound/mib)
	}
	// Nothing of the attack is kept: the live heap returns near where it started.
	if rss := co.memory(t, "VmRSS"); rss > 200*mib {
		t.Errorf("RSS after the attack is %d MiB", rss/mib)
	}
}
