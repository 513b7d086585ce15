package tokenizer

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/test/harness/heap"
)

// TestSegmentCacheHeld: the segment cache's bound holds for the memory it keeps, not only for
// its own count of it. Filled past its bound with segments of the sizes it keeps (256 B of
// text and more, a token each 4 B), it keeps on the heap (measured after a collection) no more
// than its bound, and no more than a tenth over its count.
func TestSegmentCacheHeld(t *testing.T) {
	const bound = 4 << 20
	for _, size := range []int{256, 300, 1000, 5000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			before := heap.Live()
			c := NewSegmentCache(bound, 256)
			ids := make([]int, size/4)
			for i := range 4 * bound / size {
				text := fmt.Sprintf("%08d", i) + strings.Repeat("x", size-8)
				c.put(1, text, ids)
			}
			kept := heap.Live() - before
			_, _, counted := c.Stats()
			runtime.KeepAlive(c)
			t.Logf("segments of %d B: %d bytes kept, %d counted, bound %d", size, kept, counted, bound)
			if kept > bound || kept > counted+counted/10 {
				t.Fatalf("the cache keeps %d bytes on the heap: its bound is %d, its count %d", kept, bound, counted)
			}
		})
	}
}
