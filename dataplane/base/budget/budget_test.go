package budget

import (
	"sync"
	"testing"
)

func TestReserve(t *testing.T) {
	var b Bytes
	steps := []struct {
		n, limit int64
		ok       bool
		held     int64
	}{
		{n: 60, limit: 100, ok: true, held: 60},
		{n: 41, limit: 100, ok: false, held: 60},
		{n: 40, limit: 100, ok: true, held: 100},
		{n: 1, limit: 200, ok: true, held: 101}, // each reservation is checked against its caller's limit
		{n: 0, limit: 50, ok: false, held: 101},
	}
	for i, s := range steps {
		if ok := b.Reserve(s.n, s.limit); ok != s.ok || b.Held() != s.held {
			t.Fatalf("step %d: Reserve(%d, %d) = %v, held %d; want %v, held %d", i, s.n, s.limit, ok, b.Held(), s.ok, s.held)
		}
	}
	b.Release(101)
	if b.Held() != 0 {
		t.Fatalf("held %d after releasing everything", b.Held())
	}
}

// Concurrent reservations never take the budget past its limit.
func TestReserveConcurrent(t *testing.T) {
	var b Bytes
	const limit, each, workers = 1000, 7, 64
	var wg sync.WaitGroup
	var granted sync.Map
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for range 100 {
				if b.Reserve(each, limit) {
					n++
				}
			}
			granted.Store(w, n)
		}()
	}
	wg.Wait()
	total := 0
	granted.Range(func(_, v any) bool { total += v.(int); return true })
	if want := limit / each; total != want || b.Held() != int64(want*each) {
		t.Fatalf("granted %d reservations holding %d bytes, want %d holding %d", total, b.Held(), want, want*each)
	}
}
