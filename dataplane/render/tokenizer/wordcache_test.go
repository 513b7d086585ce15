package tokenizer

import (
	"math/rand"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestEncodeFastMatchesWordLoop holds the hot loop (inline splitting and cache look-ups) to
// what it stands for, the kind's splitter and Tokenizer.word per match, on random text made of
// the splitters' alphabet, ASCII words, numbers and punctuation, cold and warm: each kind
// (cl100k's two, o200k, DeepSeek-V3's third step) on the fixture's vocabulary (the loop takes its kind as a parameter) and on
// the real tokenizers that use them.
func TestEncodeFastMatchesWordLoop(t *testing.T) {
	t.Parallel() // pure CPU, and a tokenizer is shared by concurrent requests
	parts := append([]string{"the", " quick", " Brown", "fox", "  ", "\n", "\r\n", "123", "4", " 56789", "(x", ".y", "'s", "'Re",
		" naïve", " café", "你好", " 😀", "👍🏽", "==", " |", "\t", strings.Repeat("abcdefgh", 3), " abcdefghijklmnop", "0123456789012345678",
		"HelloWorld", " CamelCaseWORDS", "ABCdef", "a/b//", "12²", "'LL", " éÉé"},
		splitAlphabet...)
	ext := extClass()
	type tokKind struct {
		name string
		kind fastKind
	}
	var runs []tokKind
	for _, k := range []fastKind{fastQwen, fastLlama, fastO200K, fastDeepSeek} {
		runs = append(runs, tokKind{"qwen-like", k})
	}
	for name, k := range map[string]fastKind{"qwen3": fastQwen, "llama3_1": fastLlama, "gptoss": fastO200K, "deepseek_v3": fastDeepSeek} {
		if _, ok := loadNamed(t, name); ok {
			runs = append(runs, tokKind{name, k})
		}
	}
	for _, run := range runs {
		tk, _ := loadNamed(t, run.name)
		r := rand.New(rand.NewSource(7))
		st := new(state)
		for i := 0; i < 20000; i++ {
			var b strings.Builder
			for n := r.Intn(24); n >= 0; n-- {
				b.WriteString(parts[r.Intn(len(parts))])
			}
			s := b.String()
			want := wordLoop(tk, s, run.kind, ext, st)
			for pass := 0; pass < 2; pass++ { // the second one warm
				if got := tk.encodeFast(nil, s, run.kind, ext, st); !reflect.DeepEqual(got, want) {
					t.Fatalf("%s, kind %d: %q:\n got %v\nwant %v", run.name, run.kind, s, got, want)
				}
			}
		}
	}
}

// wordLoop is what encodeFast stands for.
func wordLoop(tk *Tokenizer, s string, kind fastKind, ext *[classLimit]uint8, st *state) []int {
	var ids []int
	for i := 0; i < len(s); {
		end := kind.next(s, i, ext)
		ids = tk.word(ids, s, i, end, st)
		i = end
	}
	return ids
}

// TestWordCache checks both tables: keys of every length up to 16 bytes, with and without 16
// readable bytes after them; more than three ids; long words; replacement in a full set.
func TestWordCache(t *testing.T) {
	var c wordCache
	c.init()
	pad := strings.Repeat("\xff", 16)
	for n := 1; n <= maxShortWord; n++ {
		w := strings.Repeat("w", n-1) + string(rune('a'+n))
		k0, k1 := wordKeyTail(w, 0, n)
		s := w + pad
		j0, j1 := le64s(s)&keyMask[n][0], le64s(s[8:])&keyMask[n][1]
		if k0 != j0 || k1 != j1 {
			t.Fatalf("%q: key %x %x in place, %x %x copied", w, j0, j1, k0, k1)
		}
		for ids := 1; ids <= maxShortIDs; ids++ {
			want := []int32{int32(n), maxID - 1, 12345}[:ids]
			c.putShort(k0, k1, n, want)
			m, x, ok := c.getShort(k0, k1, n)
			if got := appendShort(nil, m, x); !ok || len(got) != ids || got[0] != int(want[0]) || got[ids-1] != int(want[ids-1]) {
				t.Fatalf("%q: got %v (%v), want %v", w, got, ok, want)
			}
		}
		if _, _, ok := c.getShort(k0^1, k1, n); ok {
			t.Fatalf("%q: another key hits", w)
		}
		if _, _, ok := c.getShort(k0, k1, n+1); ok {
			t.Fatalf("%q: another length hits", w)
		}
	}
	// A full set keeps taking new words, and each one is found right after it is stored.
	for i := 0; i < 1000; i++ {
		k0 := uint64(i) * 0x9E3779B97F4A7C15
		c.putShort(k0, 0, 8, []int32{int32(i)})
		if m, x, ok := c.getShort(k0, 0, 8); !ok || appendShort(nil, m, x)[0] != i {
			t.Fatalf("word %d not found after put", i)
		}
	}
	long := strings.Repeat("long word ", 5)
	c.putLong(long, []int32{1, 2, 3, 4, 5})
	if ids, ok := c.getLong(long); !ok || len(ids) != 5 {
		t.Fatalf("long word: %v, %v", ids, ok)
	}
	if _, ok := c.getLong(long[1:]); ok {
		t.Fatal("another long word hits")
	}
}

// TestWordCacheKeepsUpToMaxCachedWord: a merged word of maxCachedWord bytes is kept, a longer
// one is merged each time and kept nowhere.
func TestWordCacheKeepsUpToMaxCachedWord(t *testing.T) {
	tk, ok := loadNamed(t, "sp-gemma-like")
	if !ok {
		t.Fatal("the sp-gemma-like fixture does not load")
	}
	for _, tc := range []struct {
		n    int
		kept bool
	}{{maxShortWord + 1, true}, {maxCachedWord, true}, {maxCachedWord + 1, false}, {4 * maxCachedWord, false}} {
		w := strings.Repeat("ab", tc.n/2) + strings.Repeat("c", tc.n%2) // no space: one word
		ids := tk.Encode(nil, w, false)
		got, kept := tk.words.getLong(w)
		if kept != tc.kept {
			t.Errorf("a word of %d bytes: kept %t, want %t", tc.n, kept, tc.kept)
		}
		if kept && !slices.Equal(int32sToInts(got), ids) {
			t.Errorf("a word of %d bytes: kept %v, encoded %v", tc.n, got, ids)
		}
	}
}

func int32sToInts(s []int32) []int {
	out := make([]int, len(s))
	for i, v := range s {
		out[i] = int(v)
	}
	return out
}

// TestWordCacheConcurrent has writers keep replacing the entries of one set with different words
// while a reader checks that whatever it finds is the word's: a torn slot must read as a miss
// (run it under the race detector too).
func TestWordCacheConcurrent(t *testing.T) {
	var c wordCache
	c.init()
	// Eight keys of the same set, whose ids encode the key.
	var keys []uint64
	for k0 := uint64(1); len(keys) < 8; k0++ {
		if c.set(k0, 0, 2) == c.set(1, 0, 2) {
			keys = append(keys, k0)
		}
	}
	idsOf := func(k0 uint64) []int32 { return []int32{int32(k0), int32(k0 + 1), int32(k0 + 2)} }
	for _, k0 := range keys {
		c.putShort(k0, 0, 2, idsOf(k0))
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 2; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k0 := keys[i%len(keys)]
				c.putShort(k0, 0, 2, idsOf(k0))
			}
		}()
	}
	hits := 0
	for i := 0; i < 200000; i++ {
		k0 := keys[i%len(keys)]
		if m, x, ok := c.getShort(k0, 0, 2); ok {
			hits++
			if got, want := appendShort(nil, m, x), idsOf(k0); got[0] != int(want[0]) || got[1] != int(want[1]) || got[2] != int(want[2]) {
				t.Fatalf("key %d: got %v, want %v", k0, got, want)
			}
		}
	}
	close(stop)
	wg.Wait()
	if hits == 0 {
		t.Error("no hits")
	}
}
