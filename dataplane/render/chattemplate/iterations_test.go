package chattemplate

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestIterationCacheBounds renders many conversations through a small iteration cache: it holds
// no more than its budget, evicts the least recently used, and does not keep an iteration over
// an eighth of it (a long message's), which is run every turn, correctly.
func TestIterationCacheBounds(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}{{ m.role }}: {{ m.content }}|{% endfor %}`)
	const budget = 16 << 10
	c, ic := NewMessageCache(1<<20), NewIterationCache(budget)
	render := func(msgs json.RawMessage) {
		t.Helper()
		want, err := tmpl.Render(msgs, Options{Validated: true})
		if err != nil {
			t.Fatal(err)
		}
		got, err := tmpl.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs), Iterations: ic})
		if err != nil || got != want {
			t.Fatalf("%.60q (%v), want %.60q", got, err, want)
		}
		if _, _, bytes := ic.Stats(); bytes > budget {
			t.Fatalf("%d bytes held, over the budget of %d", bytes, budget)
		}
	}
	for i := range 200 {
		render(json.RawMessage(fmt.Sprintf(`[{"role":"user","content":"conversation %d"},{"role":"assistant","content":"answer %d"}]`, i, i)))
	}
	if _, _, bytes := ic.Stats(); bytes < budget/2 {
		t.Errorf("%d bytes held after 200 conversations: the budget is %d", bytes, budget)
	}
	// The first conversation was evicted: its iterations run again.
	r0, n0, _ := ic.Stats()
	render(json.RawMessage(`[{"role":"user","content":"conversation 0"},{"role":"assistant","content":"answer 0"}]`))
	if r, n, _ := ic.Stats(); r != r0 || n != n0+2 {
		t.Errorf("an evicted conversation: %d replayed, %d run; want 0, 2", r-r0, n-n0)
	}
	// A message whose iteration is over an eighth of the budget is run every turn.
	long := json.RawMessage(`[{"role":"user","content":"` + strings.Repeat("long ", budget/8/5+1) + `"}]`)
	render(long)
	r0, n0, _ = ic.Stats()
	render(long)
	if r, n, _ := ic.Stats(); r != r0 || n != n0+1 {
		t.Errorf("a long message's iteration: %d replayed, %d run; want 0, 1", r-r0, n-n0)
	}
}

// TestIterationCacheCountsValues: an iteration is counted with the values it keeps alive, its
// message and what it made (here a list of a word per space of its message, 24 B and more per
// byte of the message): one that would keep more than an eighth of the cache is run every turn,
// not kept small-looking.
func TestIterationCacheCountsValues(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}{% set words = m.content.split(' ') %}{{ words | length }}|{% endfor %}`)
	const budget = 64 << 10
	msgs := json.RawMessage(`[{"role":"user","content":"` + strings.Repeat(" ", budget/8/24+1) + `"}]`)
	c, ic := NewMessageCache(1<<20), NewIterationCache(budget)
	for range 2 {
		if _, err := tmpl.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs), Iterations: ic}); err != nil {
			t.Fatal(err)
		}
	}
	if r, n, bytes := ic.Stats(); r != 0 || n != 2 || bytes != 0 {
		t.Errorf("%d replayed, %d run, %d bytes held: want the iteration run twice and not kept", r, n, bytes)
	}
}
