package anthropic

import (
	"bytes"
	"runtime"
	"testing"
)

// smallBlocks is a Messages request whose one user message holds n bytes of tiny text blocks.
func smallBlocks(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":[`)
	for i := 0; b.Len() < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"type":"text","text":"x"}`)
	}
	b.WriteString(`]}]}`)
	return b.Bytes()
}

// BenchmarkTranslateSmallBlocks translates 1 MiB of tiny text blocks (the shape that costs the
// translation the most per byte); B/in is the bytes allocated per input byte.
func BenchmarkTranslateSmallBlocks(b *testing.B) {
	raw := smallBlocks(1 << 20)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for b.Loop() {
		if _, err := Translate(raw, Create, 0); err != nil {
			b.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/float64(len(raw)), "B/in")
}

// The translation of tiny text blocks allocates about the chat body it writes (the glue, grown by
// doubling), and a number of times that does not grow with the blocks.
func TestTranslateCostPerBlock(t *testing.T) {
	raw := smallBlocks(1 << 20)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	allocs := testing.AllocsPerRun(1, func() {
		if _, err := Translate(raw, Create, 0); err != nil {
			t.Fatal(err)
		}
	})
	runtime.ReadMemStats(&after)
	perByte := float64(after.TotalAlloc-before.TotalAlloc) / 2 / float64(len(raw)) // AllocsPerRun runs it twice
	if perByte > 3 || allocs > 64 {
		t.Fatalf("%.1f bytes allocated per input byte, %v allocations for %d blocks", perByte, allocs, len(raw)/27)
	}
}
