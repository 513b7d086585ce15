package chattemplate

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// longJSON is a JSON string of about n bytes that needs decoding (escapes), marked with tag.
func longJSON(tag string, n int) string {
	raw, _ := json.Marshal(tag + ": " + strings.Repeat("line \"quoted\"\n", n/16))
	return string(raw)
}

// TestStringCacheRender renders conversations twice through one cache (the second time from it)
// and once without: the three renders are equal, and the cache is used for the long strings that
// need decoding only.
func TestStringCacheRender(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}[{{ m.role }}] {{ m.content }}|{% endfor %}`)
	for _, tc := range []struct {
		name         string
		contents     []string // JSON strings
		hits, misses uint64   // of the second render
	}{
		{"escaped and long", []string{longJSON("a", 600), longJSON("b", 300)}, 2, 0},
		{"short", []string{`"short \"one\""`}, 0, 0},
		{"plain (shares the request's bytes)", []string{`"` + strings.Repeat("plain text ", 40) + `"`}, 0, 0},
		{"invalid UTF-8", []string{"\"" + strings.Repeat("bad \xff byte ", 30) + "\""}, 1, 0},
		{"a long key is a string too", []string{`{"` + strings.Repeat("k", 300) + `\n": 1}`}, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var msgs []string
			for _, c := range tc.contents {
				msgs = append(msgs, `{"role":"user","content":`+c+`}`)
			}
			raw := json.RawMessage("[" + strings.Join(msgs, ",") + "]")
			want, err := tmpl.Render(raw, Options{})
			if err != nil {
				t.Fatal(err)
			}
			c := NewStringCache(1 << 20)
			for i := range 2 {
				h0, m0, _ := c.Stats()
				got, err := tmpl.Render(raw, Options{Strings: c})
				if err != nil || got != want {
					t.Fatalf("render %d through the cache = %q (%v), want %q", i, got, err, want)
				}
				h, m, _ := c.Stats()
				if i == 1 && (h-h0 != tc.hits || m-m0 != tc.misses) {
					t.Errorf("second render: %d hits, %d misses; want %d, %d", h-h0, m-m0, tc.hits, tc.misses)
				}
			}
		})
	}
}

// TestStringCacheCompares plants an entry under the key of another string: a look-up compares
// the JSON text, so it misses rather than answer another string's text.
func TestStringCacheCompares(t *testing.T) {
	c := NewStringCache(1 << 20)
	a, b := []byte(longJSON("a", 400)), []byte(longJSON("b", 400))
	_, key, ok := c.get(a)
	if ok {
		t.Fatal("an empty cache found a string")
	}
	c.put(key, b, "the text of b") // b under a's key, as a collision would leave it
	if text, _, ok := c.get(a); ok {
		t.Fatalf("a found %q, the text of another string under its key", text)
	}
	c.put(key, a, "the text of a")
	if text, _, ok := c.get(a); !ok || text != "the text of a" {
		t.Fatalf("a = %q, %v after it was kept", text, ok)
	}
	if _, _, bytes := c.Stats(); bytes != int64(len(a))+int64(len("the text of a"))+stringOverhead {
		t.Errorf("bytes = %d after a replaced b: b's bytes are not given back", bytes)
	}
}

// TestStringCacheBound fills a small cache: it holds no more than its bound, drops the least
// recently used strings first, and keeps no string over its share.
func TestStringCacheBound(t *testing.T) {
	const bound = 64 << 10
	c := NewStringCache(bound)
	var raws [][]byte
	for i := range 200 {
		raw := []byte(longJSON(fmt.Sprint(i), 1000))
		_, key, _ := c.get(raw)
		c.put(key, raw, strings.Repeat("x", len(raw)))
		raws = append(raws, raw)
		if _, _, bytes := c.Stats(); bytes > bound {
			t.Fatalf("after %d strings the cache holds %d bytes, over its %d", i+1, bytes, bound)
		}
	}
	if _, _, ok := c.get(raws[0]); ok {
		t.Error("the first string is still kept after 200 of 2 KiB in 64 KiB")
	}
	if _, _, ok := c.get(raws[len(raws)-1]); !ok {
		t.Error("the last string kept is gone")
	}
	big := []byte(longJSON("big", bound/maxEntryShare))
	_, key, _ := c.get(big)
	c.put(key, big, string(big))
	if _, _, ok := c.get(big); ok {
		t.Errorf("a string of %d bytes was kept: over a cache of %d's share", len(big), bound)
	}
}

// TestStringCacheTemplateChanges renders, through one cache, a template that changes its
// messages (update, pop, append): the next render sees the client's messages as they were.
func TestStringCacheTemplateChanges(t *testing.T) {
	tmpl := loadInline(t, `{% set _ = messages[0].update({'content': 'changed'}) %}{% set last = messages.pop() %}`+
		`{% set _ = messages.append({'role': 'x', 'content': last.content}) %}{% for m in messages %}[{{ m.role }}] {{ m.content }}|{% endfor %}`)
	raw := json.RawMessage(`[{"role":"user","content":` + longJSON("first", 400) + `},{"role":"assistant","content":` + longJSON("second", 400) + `}]`)
	c := NewStringCache(1 << 20)
	want, err := tmpl.Render(raw, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if got, err := tmpl.Render(raw, Options{Strings: c}); err != nil || got != want {
			t.Fatalf("render %d = %q (%v), want %q", i, got, err, want)
		}
	}
}

// TestStringCacheConcurrent renders from several goroutines through one small cache (go test
// -race checks its locking): every render is the uncached one.
func TestStringCacheConcurrent(t *testing.T) {
	tmpl := loadInline(t, `{% for m in messages %}[{{ m.role }}] {{ m.content }}|{% endfor %}`)
	var raws []json.RawMessage
	var wants []string
	for i := range 16 {
		raw := json.RawMessage(`[{"role":"user","content":` + longJSON(fmt.Sprint("conversation ", i), 1000) + `}]`)
		want, err := tmpl.Render(raw, Options{})
		if err != nil {
			t.Fatal(err)
		}
		raws, wants = append(raws, raw), append(wants, want)
	}
	c := NewStringCache(20 << 10) // room for 9 of the 16 (2.1 KiB each): strings are evicted while others are read
	var wg sync.WaitGroup
	errs := make(chan string, 4*50)
	for g := range 4 {
		wg.Go(func() {
			for k := range 50 {
				i := (g + k) % len(raws)
				if got, err := tmpl.Render(raws[i], Options{Strings: c}); err != nil || got != wants[i] {
					errs <- fmt.Sprintf("goroutine %d: conversation %d rendered %.40q (%v)", g, i, got, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if h, m, _ := c.Stats(); h == 0 || m == 0 {
		t.Errorf("%d hits, %d misses: the cache was not both used and evicted from", h, m)
	}
}
