package integration

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/option"
	"golang.org/x/crypto/blake2s"

	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

// rankOf is the data-parallel rank a request id hashes to: the first 8 bytes of
// blake2s-256(id), big-endian, mod size.
func rankOf(id string, size int) string {
	sum := blake2s.Sum256([]byte(id))
	return strconv.FormatUint(binary.BigEndian.Uint64(sum[:8])%uint64(size), 10)
}

// dpSteps is a prefill and a decode step with their data_parallel_size (0: not set; a negative
// prefill size: no prefill step).
func dpSteps(prefill, decode int) string {
	step := func(typ string, size int) string {
		if size == 0 {
			return "    - type: " + typ + "\n"
		}
		return fmt.Sprintf("    - type: %s\n      params: {data_parallel_size: %d}\n", typ, size)
	}
	s := step("decode", decode)
	if prefill >= 0 {
		s = step("prefill", prefill) + s
	}
	return s
}

// rankLeg is what a worker recorded of one leg: its X-Data-Parallel-Rank values and the
// kv_transfer_params it carried.
type rankLeg struct {
	ranks []string
	kv    map[string]any
}

// legOf returns the one inference leg w recorded for the client request id (its legs carry it in
// x-coordinator-request-id).
func legOf(t *testing.T, w *simworker.Worker, id string) rankLeg {
	t.Helper()
	var legs []rankLeg
	for _, r := range w.Requests() {
		if r.Method != http.MethodPost || r.Header.Get("X-Coordinator-Request-Id") != id {
			continue
		}
		var b struct {
			KV map[string]any `json:"kv_transfer_params"`
		}
		if err := json.Unmarshal(r.Body, &b); err != nil {
			t.Fatalf("%s got a non-JSON body: %s", w.Name(), r.Body)
		}
		legs = append(legs, rankLeg{ranks: r.Header.Values("X-Data-Parallel-Rank"), kv: b.KV})
	}
	if len(legs) != 1 {
		t.Fatalf("%s got %d legs of %s, want 1", w.Name(), len(legs), id)
	}
	return legs[0]
}

// With kv-nixl and data_parallel_size 4 on both steps, the prefill leg carries the request id's
// hash as X-Data-Parallel-Rank (a client's own value is dropped), the prefill worker reports the
// rank it ran on in remote_dp_rank, and the decode leg carries that rank: one request, one rank.
func TestDataParallelRankPinsBothLegs(t *testing.T) {
	s := start(t, stack.Options{}, "kv-nixl", "ec-shared-storage", true, dpSteps(4, 4))
	ctx := context.Background()
	ranks := map[string]bool{}
	for i, id := range []string{"dp-rank-1", "dp-rank-2", "dp-rank-3", "req-1", "client-id-1"} {
		opts := []option.RequestOption{option.WithHeader("X-Request-Id", id), option.WithHeader("X-Data-Parallel-Rank", "0")}
		if i%2 == 0 {
			resp, err := s.client.Chat.Completions.New(ctx, chatParams("red green blue", 4), opts...)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Choices[0].Message.Content != "red green blue red" {
				t.Fatalf("%s: answer %q", id, resp.Choices[0].Message.Content)
			}
		} else if text, _ := streamChat(t, s.client, chatParams("cyan magenta", 3), opts...); text != "cyan magenta cyan" {
			t.Fatalf("%s: stream %q", id, text)
		}
		if got := profiles(s.legsFor(id)); got != "prefill:200,decode:200" {
			t.Fatalf("%s: legs %s", id, got)
		}
		want := rankOf(id, 4)
		ranks[want] = true
		pre, dec := legOf(t, s.stack.Prefill[0], id), legOf(t, s.stack.Decode[0], id)
		if len(pre.ranks) != 1 || pre.ranks[0] != want {
			t.Fatalf("%s: prefill X-Data-Parallel-Rank %q, want %s", id, pre.ranks, want)
		}
		// The decode leg's params are the prefill answer's: remote_dp_rank is what it reported.
		if fmt.Sprint(dec.kv["remote_dp_rank"]) != want {
			t.Fatalf("%s: the prefill worker reported remote_dp_rank %v, want %s", id, dec.kv["remote_dp_rank"], want)
		}
		if len(dec.ranks) != 1 || dec.ranks[0] != want {
			t.Fatalf("%s: decode X-Data-Parallel-Rank %q, want %s", id, dec.ranks, want)
		}
	}
	if len(ranks) < 2 {
		t.Fatalf("every request landed on rank %v", ranks)
	}
}

// The decode leg follows the rank the prefill worker reported rather than its own hash. To tell
// the two apart the prefill step is given 2 ranks and decode 4: dp-rank-1 hashes to 1 of 2 and
// 3 of 4, so the prefill runs on rank 1, reports it, and decode is pinned to 1.
func TestDataParallelRankDecodeFollowsPrefill(t *testing.T) {
	const id = "dp-rank-1"
	if rankOf(id, 2) != "1" || rankOf(id, 4) != "3" {
		t.Fatalf("%s hashes to %s of 2, %s of 4", id, rankOf(id, 2), rankOf(id, 4))
	}
	s := start(t, stack.Options{}, "kv-nixl", "ec-shared-storage", true, dpSteps(2, 4))
	if _, err := s.client.Chat.Completions.New(context.Background(), chatParams("one two", 2), option.WithHeader("X-Request-Id", id)); err != nil {
		t.Fatal(err)
	}
	pre, dec := legOf(t, s.stack.Prefill[0], id), legOf(t, s.stack.Decode[0], id)
	if fmt.Sprint(pre.ranks) != "[1]" || fmt.Sprint(dec.ranks) != "[1]" || fmt.Sprint(dec.kv["remote_dp_rank"]) != "1" {
		t.Fatalf("prefill rank %q, decode rank %q (remote_dp_rank %v); want 1 on both", pre.ranks, dec.ranks, dec.kv["remote_dp_rank"])
	}
}

// Each step pins only its own leg, and only with a size above 1: neither leg carries a rank
// with size 1 (the default), a client's own rank is dropped, and a decode that no prefill
// preceded carries none. (Sizes that differ between the steps are a misconfiguration, shown
// here only for what each step does on its own.)
func TestDataParallelRankPerStep(t *testing.T) {
	const id = "dp-off-1"
	tests := map[string]struct {
		steps            string
		prefill          bool
		wantPre, wantDec string // the legs' X-Data-Parallel-Rank values, "" for none
	}{
		"size 1":              {steps: dpSteps(1, 1), prefill: true},
		"default":             {steps: dpSteps(0, 0), prefill: true},
		"decode only, size 4": {steps: dpSteps(-1, 4)},
		"prefill 4, decode 1": {steps: dpSteps(4, 1), prefill: true, wantPre: rankOf(id, 4)},
		// The unpinned prefill reports no rank: decode falls back to the hash.
		"prefill 1, decode 4": {steps: dpSteps(1, 4), prefill: true, wantDec: rankOf(id, 4)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := start(t, stack.Options{}, "kv-nixl", "ec-shared-storage", true, tc.steps)
			_, err := s.client.Chat.Completions.New(context.Background(), chatParams("one two", 2),
				option.WithHeader("X-Request-Id", id), option.WithHeader("X-Data-Parallel-Rank", "2"))
			if err != nil {
				t.Fatal(err)
			}
			var pre rankLeg
			if tc.prefill {
				pre = legOf(t, s.stack.Prefill[0], id)
			} else if n := len(s.stack.Prefill[0].Requests()); n != 0 {
				t.Fatalf("%d prefill legs", n)
			}
			dec := legOf(t, s.stack.Decode[0], id)
			if strings.Join(pre.ranks, ",") != tc.wantPre || strings.Join(dec.ranks, ",") != tc.wantDec {
				t.Fatalf("prefill rank %q, decode rank %q; want %q, %q", pre.ranks, dec.ranks, tc.wantPre, tc.wantDec)
			}
		})
	}
}
