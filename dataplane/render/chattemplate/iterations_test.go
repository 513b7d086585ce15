package chattemplate

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
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

// TestIterationCacheLinks: a dict links the iterations the cache keeps of it, one a loop, and
// only those. Two caches over one message cache (the same dicts) take the dicts from each
// other: each replays what it kept while no other cache kept an iteration of the dict since,
// and renders correctly throughout (concurrently too, under the race detector). After many
// conversations have passed through a small cache, every link of its is to an entry its list
// still holds (an evicted iteration is unlinked), and every entry of its list is linked.
func TestIterationCacheLinks(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}{{ m.role }}{% endfor %}|{% for m in messages %}{{ m.content }};{% endfor %}`)
	msgs := json.RawMessage(`[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]`)
	want, err := tmpl.Render(msgs, Options{Validated: true})
	if err != nil {
		t.Fatal(err)
	}
	c := NewMessageCache(1 << 20)
	a, b := NewIterationCache(1<<20), NewIterationCache(1<<20)
	for turn, ic := range []*IterationCache{a, a, b, b, a} {
		got, err := tmpl.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs), Iterations: ic})
		if err != nil || got != want {
			t.Fatalf("turn %d: %q (%v), want %q", turn, got, err, want)
		}
	}
	if r, n, _ := a.Stats(); r != 6 || n != 12 {
		t.Errorf("the first cache: %d replayed, %d run; want 6 (its second render of two loops over three messages), 12", r, n)
	}
	if r, n, _ := b.Stats(); r != 6 || n != 6 {
		t.Errorf("the second cache: %d replayed, %d run; want 6, 6", r, n)
	}
	var wg sync.WaitGroup // the two caches relinking the same dicts at once (under the race detector, no unguarded access)
	for g := range 8 {
		wg.Go(func() {
			for range 50 {
				ic := []*IterationCache{a, b}[g%2]
				if got, err := tmpl.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs), Iterations: ic}); err != nil || got != want {
					t.Errorf("concurrently: %q (%v), want %q", got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()

	small := NewIterationCache(8 << 10)
	for i := range 100 {
		conv := json.RawMessage(fmt.Sprintf(`[{"role":"user","content":"question %d"},{"role":"assistant","content":"answer %d"}]`, i, i))
		for range 2 {
			if _, err := tmpl.Render(conv, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, conv), Iterations: small}); err != nil {
				t.Fatal(err)
			}
		}
	}
	kept := map[*iterationEntry]bool{}
	for e := small.entries.root.next; e != &small.entries.root; e = e.next {
		kept[e] = true
		l, _ := e.key.Item.MemoLink().(*dictLinks)
		if l == nil || l.cache != small || l.slot(e.key.Loop) == nil || *l.slot(e.key.Loop) != e {
			t.Fatalf("the list holds an iteration its dict does not link (Iterations would not find it)")
		}
	}
	linked := 0
	for _, e := range c.entries.m {
		d := e.val.val.val.AsDict()
		l, _ := d.MemoLink().(*dictLinks)
		if l == nil || l.cache != small {
			continue
		}
		for _, le := range append(l.entries[:], l.more...) {
			if le == nil {
				continue
			}
			linked++
			if !kept[le] || le.key.Item != d {
				t.Fatalf("a dict links an iteration its cache's list does not hold (evicted, or another's)")
			}
		}
	}
	if linked == 0 || linked != len(kept) {
		t.Errorf("%d links for %d iterations kept", linked, len(kept))
	}
}

// TestIterationCacheReplaces: an iteration run again because what it read changed (here
// loop.last, once a message follows it) replaces the one its loop kept of the dict: the cache
// holds one iteration a loop and dict, and the next turn replays the new one.
func TestIterationCacheReplaces(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %};{% endfor %}`)
	c, ic := NewMessageCache(1<<20), NewIterationCache(1<<20)
	turns := []string{`[{"role":"user","content":"a"}]`,
		`[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]`,
		`[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]`}
	wantReplayed := []uint64{0, 0, 1} // a, kept anew on the second turn with loop.last false, replays on the third
	for i, turn := range turns {
		msgs := json.RawMessage(turn)
		want, err := tmpl.Render(msgs, Options{Validated: true})
		if err != nil {
			t.Fatal(err)
		}
		r0, _, _ := ic.Stats()
		got, err := tmpl.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs), Iterations: ic})
		if err != nil || got != want {
			t.Fatalf("turn %d: %q (%v), want %q", i, got, err, want)
		}
		kept := 0
		for e := ic.entries.root.next; e != &ic.entries.root; e = e.next {
			kept++
		}
		if r, _, _ := ic.Stats(); r-r0 != wantReplayed[i] || kept != i+1 {
			t.Errorf("turn %d: %d replayed, %d iterations kept; want %d, %d (one a message)", i, r-r0, kept, wantReplayed[i], i+1)
		}
	}
}
