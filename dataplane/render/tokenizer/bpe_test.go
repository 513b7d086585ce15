package tokenizer

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
)

// TestMergeHeapMatchesSmall holds the two merge algorithms to each other on random words.
func TestMergeHeapMatchesSmall(t *testing.T) {
	tk, _ := loadNamed(t, "qwen-like")
	r := rand.New(rand.NewSource(1))
	parts := []string{"the", " the", "a", "e", "th", "in", "ing", " ", "  ", "\n", "你", "好", "😀", "he", "ll", "o"}
	st := new(state)
	for i := 0; i < 5000; i++ {
		var b strings.Builder
		for n := 1 + r.Intn(20); n > 0; n-- {
			b.WriteString(parts[r.Intn(len(parts))])
		}
		w := b.String()
		small := append([]int32(nil), tk.mergeSmall(w, st)...)
		heap := append([]int32(nil), tk.mergeHeap(w, st)...)
		if !reflect.DeepEqual(small, heap) {
			t.Fatalf("%q: small %v, heap %v", w, small, heap)
		}
	}
}

// TestEncodeAllocatesNothing: a warmed encode into a large enough dst allocates nothing, words
// cached or not (the long word goes through the heap merge, never cached).
func TestEncodeAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	for _, name := range []string{"qwen-like", "llama-like", "gpt2-like"} {
		tk, _ := loadNamed(t, name)
		text := "<|im_start|>user\nHello, world! It's 2024: naïve café, 你好世界 😀.\n" + strings.Repeat("x", 300) + "\n\n  end<|im_end|>"
		dst := tk.Encode(nil, text, true)
		allocs := testing.AllocsPerRun(100, func() {
			dst = tk.Encode(dst[:0], text, true)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per Encode, want 0", name, allocs)
		}
	}
}

// TestSegmentCacheSecondSight: a cache that admits on second sight keeps a segment the second time
// it is encoded, finds it the third, and keeps none of a flood of segments each encoded once; its
// slots come out of its budget.
func TestSegmentCacheSecondSight(t *testing.T) {
	tk, _ := loadNamed(t, "qwen-like")
	c := NewSegmentCache(1<<20, 8)
	c.AdmitOnSecondSight()
	if got, want := c.maxBytes, int64(1<<20-8*256); got != want {
		t.Fatalf("budget %d, want %d (256 slots taken from it)", got, want)
	}
	text := "<|im_start|>user\na message worth keeping<|im_end|>"
	want := tk.Encode(nil, text, false)
	for i, w := range []struct {
		hits, misses uint64
		kept         bool
	}{{0, 1, false}, {0, 2, true}, {1, 2, true}} {
		if got := tk.EncodeCached(nil, text, false, c); !reflect.DeepEqual(got, want) {
			t.Fatalf("encoding %d: %v, want %v", i+1, got, want)
		}
		hits, misses, bytes := c.Stats()
		if hits != w.hits || misses != w.misses || (bytes > 0) != w.kept {
			t.Fatalf("encoding %d: hits %d, misses %d, bytes %d; want %d, %d, kept %v", i+1, hits, misses, bytes, w.hits, w.misses, w.kept)
		}
	}
	_, _, held := c.Stats()
	for i := range 10000 {
		tk.EncodeCached(nil, fmt.Sprintf("one-off segment number %d", i), false, c)
	}
	if _, _, bytes := c.Stats(); bytes != held {
		t.Fatalf("bytes %d after segments encoded once, want %d (none kept)", bytes, held)
	}
	if got := tk.EncodeCached(nil, text, false, c); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the flood: %v, want %v", got, want)
	}
	if hits, _, _ := c.Stats(); hits != 2 {
		t.Fatalf("hits %d after the flood, want 2: the segment kept was evicted", hits)
	}
	// The smallest budget has one slot.
	tiny := NewSegmentCache(4096, 1)
	tiny.AdmitOnSecondSight()
	if len(tiny.seen) != 1 || tiny.maxBytes != 4096-8 {
		t.Fatalf("a 4 KiB cache: %d slots, budget %d; want 1, 4088", len(tiny.seen), tiny.maxBytes)
	}
}

func TestSegmentCache(t *testing.T) {
	tk, _ := loadNamed(t, "qwen-like")
	c := NewSegmentCache(4096, 8)
	msg := func(i int) string {
		return "<|im_start|>user\nmessage number " + strings.Repeat("x", i) + "<|im_end|>\n"
	}
	conv := ""
	for i := 0; i < 5; i++ {
		conv += msg(i)
		got := tk.EncodeCached(nil, conv, false, c)
		if want := tk.Encode(nil, conv, false); !reflect.DeepEqual(got, want) {
			t.Fatalf("turn %d: cached %v, want %v", i, got, want)
		}
	}
	// Segments: "user\nmessage number x…" (long enough) and "\n" (too short, never looked up).
	hits, misses, bytes := c.Stats()
	if hits != 10 || misses != 5 {
		t.Errorf("hits, misses = %d, %d; want 10, 5", hits, misses)
	}
	if bytes <= 0 || bytes > 4096 {
		t.Errorf("bytes = %d, want in (0, 4096]", bytes)
	}
	// A budget smaller than the segments keeps the cache within it, evicting the oldest.
	small := NewSegmentCache(300, 1)
	for i := 0; i < 50; i++ {
		tk.EncodeCached(nil, msg(i), false, small)
		if _, _, b := small.Stats(); b > 300 {
			t.Fatalf("bytes %d over budget 300", b)
		}
	}
	// Another tokenizer sharing the cache does not see the first one's ids.
	other, _ := loadNamed(t, "gpt2-like")
	shared := NewSegmentCache(1<<20, 1)
	a := tk.EncodeCached(nil, "shared text", false, shared)
	b := other.EncodeCached(nil, "shared text", false, shared)
	if wantB := other.Encode(nil, "shared text", false); !reflect.DeepEqual(b, wantB) || reflect.DeepEqual(a, b) {
		t.Errorf("shared cache: %v / %v, want %v for the second tokenizer", a, b, wantB)
	}
}
