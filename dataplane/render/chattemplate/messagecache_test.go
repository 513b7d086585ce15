package chattemplate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// TestReadsInputsOnly lists what keeps a template from sharing decoded messages: a call of a
// method that changes a list or a dict, and a set of an attribute of anything but a namespace
// the template made.
func TestReadsInputsOnly(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want bool
	}{
		{`{% for m in messages %}[{{ m.role }}] {{ m.content | trim }}{% endfor %}`, true},
		{`{{ messages | reverse | list | length }}{{ messages[0].content.split('x') }}{{ (messages | sort(attribute='role'))[0].role }}`, true},
		{`{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}`, true},
		{`{% set ns = namespace(a=1) %}{% if x %}{% set ns = namespace(a=2) %}{% endif %}{% set ns.a = 3 %}`, true},
		{`{{ "a.append(b) in a string" }}`, false}, // errs towards no sharing
		{`{{ messages.append({'role': 'user'}) }}`, false},
		{`{% set _ = messages[0].update({'content': 'x'}) %}`, false},
		{`{% set last = messages.pop() %}`, false},
		{`{{ messages[0].tool_calls . insert (0, 1) }}`, false},
		{`{% set ns.a = 1 %}`, false},                                                               // ns is an input
		{`{% set m = messages[0] %}{% set m.content = 'x' %}`, false},                               // an alias of a message
		{`{% for m in messages %}{% set m.content = 'x' %}{% endfor %}`, false},                     // a loop's target
		{`{% set ns = namespace() %}{% for ns in messages %}{% endfor %}{% set ns.a = 1 %}`, false}, // a loop rebinds it
		{`{% set ns = namespace() %}{% set ns = messages[0] %}{% set ns.a = 1 %}`, false},           // a set rebinds it
		{`{% macro f(ns) %}{% set ns.a = 1 %}{% endmacro %}{% set ns = namespace() %}`, false},      // a parameter
		{`{% set a, b = namespace(), namespace() %}{% set a.x = 1 %}`, false},                       // unpacked
		{`{% set ns %}text{% endset %}{% set ns.x = 1 %}`, false},                                   // a block set
		{`{% with m = messages[0] %}{{ m.role }}{% endwith %}`, false},                              // with binds names
		{`{% set ns = namespace(found=false) %}{% set ns.found = true %}{{ ns.found }}`, true},
	} {
		if got := readsInputsOnly(tc.src); got != tc.want {
			t.Errorf("readsInputsOnly(%s) = %v, want %v", tc.src, got, tc.want)
		}
	}
}

// chatItems splits a messages array as the renderer's caller does.
func chatItems(t *testing.T, raw json.RawMessage) []json.RawMessage {
	t.Helper()
	var items []json.RawMessage
	for obj, m := range body.Objects(raw) {
		if obj == nil {
			t.Fatal("a message is not an object")
		}
		items = append(items, m)
	}
	return items
}

// TestMessageCacheRender renders a conversation and its next turn through one cache (and one
// iteration cache), and each without: equal, with the earlier messages found and their
// iterations replayed; a template that changes its messages never shares them (a render that did
// would see the change the one before made), nor replays an iteration.
func TestMessageCacheRender(t *testing.T) {
	turn1 := json.RawMessage(`[{"role":"system","content":"be brief"},{"role":"user","content":"hi \"there\"","name":"a"},{"role":"assistant","content":"hello","tool_calls":[{"function":{"name":"f","arguments":{"x":[1,2.5,null,true]}}}]}]`)
	turn2 := json.RawMessage(strings.TrimSuffix(string(turn1), "]") + `,{"role":"user","content":"more"}]`)
	for _, tc := range []struct {
		name         string
		src          string
		hits, misses uint64 // over the three renders
		replayed     uint64
	}{
		{"reads only", `{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ m.tool_calls | tojson if m.tool_calls }}|{% endfor %}`, 7, 4, 7},
		{"changes its messages", `{% for m in messages %}{% set _ = m.update({'content': m.content + '!'}) %}{{ m.content }}|{% endfor %}`, 0, 0, 0},
		{"sets an attribute of one", `{% for m in messages %}{% set m.content = m.content + '!' %}{{ m.content }}|{% endfor %}`, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := loadInline(t, tc.src)
			c, ic := NewMessageCache(1<<20), NewIterationCache(1<<20)
			for _, msgs := range []json.RawMessage{turn1, turn2, turn2} {
				want, err := tmpl.Render(msgs, Options{Validated: true})
				if err != nil {
					t.Fatal(err)
				}
				got, err := tmpl.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs), Iterations: ic})
				if err != nil || got != want {
					t.Fatalf("through the cache: %q (%v), want %q", got, err, want)
				}
			}
			if h, m, _ := c.Stats(); h != tc.hits || m != tc.misses {
				t.Errorf("hits %d, misses %d; want %d, %d", h, m, tc.hits, tc.misses)
			}
			if r, _, _ := ic.Stats(); r != tc.replayed {
				t.Errorf("%d iterations replayed, want %d", r, tc.replayed)
			}
		})
	}
}

// TestMessageCacheOwnsStrings changes the request's bytes after a render that kept its messages:
// the next render, of the original bytes, is not changed (no kept string shares them).
func TestMessageCacheOwnsStrings(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}{{ m.role }}: {{ m.content }}|{% endfor %}`)
	orig := `[{"role":"user","content":"plain text that a decoder could share"},{"role":"assistant","content":"also plain"}]`
	c := NewMessageCache(1 << 20)
	buf := []byte(orig)
	want, err := tmpl.Render(buf, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, buf)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range buf { // the request's buffer reused for another
		if buf[i] >= 'a' && buf[i] <= 'z' {
			buf[i] = 'x'
		}
	}
	again := json.RawMessage(orig)
	got, err := tmpl.Render(again, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, again)})
	if h, _, _ := c.Stats(); err != nil || got != want || h != 2 {
		t.Fatalf("after the first request's bytes changed: %q (%v, %d hits), want %q", got, err, h, want)
	}
}

// TestMessageCacheLimits: messages found in the cache count against the render's limits as
// decoded ones do, with the same errors.
func TestMessageCacheLimits(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}{{ m.content }}{% endfor %}`)
	// 11 values (the array, 7 in the first message, 3 in the second); the deepest list at depth 4.
	msgs := json.RawMessage(`[{"role":"user","content":"a","x":[[[1]]]},{"role":"user","content":"b"}]`)
	c := NewMessageCache(1 << 20)
	if _, err := tmpl.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		values, depth int
		fails         bool
	}{{11, 128, false}, {10, 128, true}, {3, 128, true}, {1000, 5, false}, {1000, 4, true}, {1000, 1, true}, {1, 0, true}} {
		lt := tmpl.Limits()
		lt.MaxValues, lt.MaxDepth = tc.values, tc.depth
		limited := tmpl.WithLimits(lt)
		_, want := limited.Render(msgs, Options{Validated: true})
		var ie *InputError
		if tc.fails != errors.As(want, &ie) {
			t.Fatalf("%+v without the cache: %v", tc, want)
		}
		for pass := range 2 { // the first may keep what the second finds
			_, got := limited.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs)})
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("%+v, pass %d: %v, want %v", tc, pass, got, want)
			}
		}
	}
}

// TestMessageCacheConcurrent renders one conversation from many goroutines through one cache
// and one iteration cache (whose iterations write a namespace): the same text each time (and,
// under the race detector, no write to a shared value).
func TestMessageCacheConcurrent(t *testing.T) {
	tmpl := loadInline(t, `{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ ns.n }} {{ m.role }}: {{ m.content | trim }}{{ m.tool_calls | tojson if m.tool_calls }}|{% endfor %}`)
	var b strings.Builder
	b.WriteString("[")
	for i := range 50 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"role":"user","content":" message %d ","tool_calls":[{"id":"c%d"}]}`, i, i)
	}
	b.WriteString("]")
	msgs := json.RawMessage(b.String())
	want, err := tmpl.Render(msgs, Options{Validated: true})
	if err != nil {
		t.Fatal(err)
	}
	c, ic := NewMessageCache(1<<20), NewIterationCache(1<<20)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			for range 20 {
				got, err := tmpl.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs), Iterations: ic})
				if err != nil || got != want {
					errs <- fmt.Errorf("%q (%w)", got, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if h, _, _ := c.Stats(); h < 50*(16*20-16) {
		t.Errorf("%d hits", h)
	}
	if r, _, _ := ic.Stats(); r < 50*(16*20-16) {
		t.Errorf("%d iterations replayed", r)
	}
}

// TestMessageCacheTooLarge: a message over an eighth of the cache is decoded, not kept.
func TestMessageCacheTooLarge(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}{{ m.content }}|{% endfor %}`)
	msgs := json.RawMessage(`[{"role":"user","content":"` + strings.Repeat("long ", 400) + `"},{"role":"user","content":"short"}]`)
	want, err := tmpl.Render(msgs, Options{Validated: true})
	if err != nil {
		t.Fatal(err)
	}
	c := NewMessageCache(8 * 1024) // room for entries up to 1 KiB
	for range 2 {
		got, err := tmpl.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs)})
		if err != nil || got != want {
			t.Fatalf("%q (%v), want %q", got, err, want)
		}
	}
	if h, m, bytes := c.Stats(); h != 1 || m != 3 || bytes > 1024 {
		t.Errorf("hits %d, misses %d, %d bytes: want the short message alone kept", h, m, bytes)
	}
}

// TestMessageCacheCountsCopies: a message kept is counted for its JSON text (which its plain
// strings share) and for each string decoded into a copy of its own (escapes), besides its
// values' overhead; its strings are not kept in the string cache too.
func TestMessageCacheCountsCopies(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}{{ m.content }}|{% endfor %}`)
	for name, content := range map[string]string{
		"plain":   strings.Repeat("plain ", 100),
		"escaped": strings.Repeat(`line\n`, 100),
	} {
		t.Run(name, func(t *testing.T) {
			msgs := json.RawMessage(`[{"role":"user","content":"` + content + `"}]`)
			c, sc := NewMessageCache(1<<20), NewStringCache(1<<20)
			if _, err := tmpl.Render(msgs, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, msgs), Strings: sc}); err != nil {
				t.Fatal(err)
			}
			if _, _, bytes := sc.Stats(); bytes != 0 {
				t.Errorf("the string cache holds %d bytes of a message the message cache keeps", bytes)
			}
			item := int64(len(msgs) - 2) // the message's JSON text
			copied := int64(0)
			if name == "escaped" {
				copied = int64(len(strings.ReplaceAll(content, `\n`, "\n")))
			}
			want := item + copied + 3*valueOverhead + messageOverhead // three values: the dict and its two strings
			if _, _, bytes := c.Stats(); bytes != want {
				t.Errorf("%d bytes held, want %d (JSON %d, copies %d)", bytes, want, item, copied)
			}
		})
	}
}

// TestMessageCacheFindAll: looking messages up together finds what looking each up finds (the
// same value, hash and verdict, for kept messages, new ones and one sent twice), and misses a
// message whose key holds another message's text, as a collision would leave it.
func TestMessageCacheFindAll(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}{{ m.role }}: {{ m.content }}|{% endfor %}`)
	kept := json.RawMessage(`[{"role":"user","content":"first"},{"role":"assistant","content":"second"}]`)
	c := NewMessageCache(1 << 20)
	if _, err := tmpl.Render(kept, Options{Validated: true, MessageCache: c, MessageItems: chatItems(t, kept)}); err != nil {
		t.Fatal(err)
	}
	next := json.RawMessage(`[{"role":"user","content":"first"},{"role":"assistant","content":"second"},{"role":"user","content":"new"},{"role":"user","content":"first"}]`)
	raws := chatItems(t, next)
	all := c.FindAll(nil, raws)
	if len(all) != len(raws) {
		t.Fatalf("%d found for %d messages", len(all), len(raws))
	}
	for i, raw := range raws {
		one := c.Find(raw)
		if all[i].Found() != one.Found() || all[i].Hash() != one.Hash() || !all[i].of(raw) || all[i].d.val != one.d.val || all[i].d.values != one.d.values {
			t.Errorf("message %d: FindAll %+v, Find %+v", i, all[i], one)
		}
		if want := i != 2; all[i].Found() != want {
			t.Errorf("message %d found %v, want %v", i, all[i].Found(), want)
		}
	}

	// "new" kept under the key of "first", as a collision would leave it: "first" is missed.
	planted := c.Find(raws[2])
	c.put(all[0].Hash(), string(raws[2]), planted.d, 0)
	if got := c.FindAll(nil, raws[:1]); got[0].Found() {
		t.Errorf("found another message's value under a message's key: %+v", got[0])
	}
	if got := c.Find(raws[0]); got.Found() {
		t.Errorf("Find found another message's value under a message's key: %+v", got)
	}
}
