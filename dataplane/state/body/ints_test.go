package body

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
)

func TestAppendInts(t *testing.T) {
	edges := []int{0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 9999, 10000, 12345, 99999, 100000, 151645, 999999,
		1000000, 9999999, 10000000, 99999999, 100000000, 123456789, -1, -99999999, math.MaxInt, math.MinInt}
	r := rand.New(rand.NewPCG(1, 2))
	random := make([]int, 5000)
	for i := range random {
		switch i % 3 {
		case 0:
			random[i] = r.IntN(1 << 18) // a vocabulary's ids
		case 1:
			random[i] = r.IntN(1e6 + 100) // around the fast path's bound
		default:
			random[i] = int(r.Int64()) - math.MaxInt64/2 // anything, negatives included
		}
	}
	for _, tc := range []struct {
		name   string
		prefix string
		vals   []int
	}{
		{"empty", "", nil},
		{"each edge alone", "", nil},
		{"edges", "", edges},
		{"after a prefix", `{"prompt":`, edges},
		{"random", "", random},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lists := [][]int{tc.vals}
			if tc.name == "each edge alone" {
				lists = nil
				for _, v := range edges {
					lists = append(lists, []int{v})
				}
			}
			for _, vals := range lists {
				want, _ := json.Marshal(append([]int{}, vals...))
				want = append([]byte(tc.prefix), want...)
				dst := append(make([]byte, 0, len(tc.prefix)), tc.prefix...) // no room to spare: AppendInts grows it
				if got := AppendInts(dst, vals); string(got) != string(want) {
					t.Fatalf("AppendInts(%q, %v) = %s, want %s", tc.prefix, vals[:min(len(vals), 8)], got[:min(len(got), 200)], want[:min(len(want), 200)])
				}
				// The same list in two calls, the second continuing the first.
				half := len(vals) / 2
				got := AppendIntList(append(dst[:len(tc.prefix)], '['), vals[:half], false)
				got = append(AppendIntList(got, vals[half:], half > 0), ']')
				if string(got) != string(want) {
					t.Fatalf("AppendIntList in two halves = %s, want %s", got[:min(len(got), 200)], want[:min(len(want), 200)])
				}
				// After a comma, in the room IntListRoom says: in place, when no id is past 10^6.
				list, _ := json.Marshal(append([]int{}, vals...))
				list = list[1 : len(list)-1]
				room := make([]byte, 0, IntListRoom(len(vals)))
				continued := AppendIntList(room, vals, true)
				if len(vals) > 0 && string(continued) != ","+string(list) || len(vals) == 0 && len(continued) > 0 {
					t.Fatalf("AppendIntList continued = %s, want ,%s", continued[:min(len(continued), 200)], list[:min(len(list), 200)])
				}
				if big := slices.ContainsFunc(vals, func(v int) bool { return uint(v) >= 1e6 }); !big && cap(continued) != cap(room) {
					t.Fatalf("AppendIntList of %d ids grew the room for %d bytes IntListRoom gave it", len(vals), cap(room))
				}
			}
		})
	}
}

// BenchmarkAppendInts writes a 32k-token prompt's ids (a 150k vocabulary) as JSON, with
// strconv (the way before) and with AppendInts.
func BenchmarkAppendInts(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	ids := make([]int, 32<<10)
	for i := range ids {
		ids[i] = r.IntN(151_000)
	}
	b.Run("strconv", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			out := make([]byte, 0, 8*len(ids)+2)
			out = append(out, '[')
			for i, id := range ids {
				if i > 0 {
					out = append(out, ',')
				}
				out = strconv.AppendInt(out, int64(id), 10)
			}
			_ = append(out, ']')
		}
	})
	b.Run("AppendInts", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = AppendInts(nil, ids)
		}
	})
}
