package kv

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"

	"golang.org/x/crypto/blake2s"
)

// TestHashRank checks the rank against values computed outside Go (Python's
// hashlib.blake2s(id).digest()[:8] read big-endian, mod size) and against blake2s.Sum256.
func TestHashRank(t *testing.T) {
	tests := []struct {
		id   string
		hash uint64 // first 8 bytes of blake2s-256(id), big-endian
		mod  map[int]int
	}{
		{"req-1", 2190497553847634069, map[int]int{2: 1, 3: 2, 4: 1, 8: 5, 16: 5}},
		{"client-id-1", 3086382162690764247, map[int]int{2: 1, 3: 0, 4: 3, 8: 7, 16: 7}},
		{"cmpl-abc-123", 12340374237518270551, map[int]int{2: 1, 3: 1, 4: 3, 8: 7, 16: 7}},
		{"00000000-0000-0000-0000-000000000000", 5689561892263410246, map[int]int{2: 0, 3: 0, 4: 2, 8: 6, 16: 6}},
		{"", 7575470396830417044, map[int]int{2: 0, 3: 0, 4: 0, 8: 4, 16: 4}},
		{"dp-rank-1", 3466157404446057675, map[int]int{2: 1, 3: 0, 4: 3, 8: 3, 16: 11}},
	}
	for _, tc := range tests {
		sum := blake2s.Sum256([]byte(tc.id))
		if got := binary.BigEndian.Uint64(sum[:8]); got != tc.hash {
			t.Fatalf("blake2s(%q)[:8] = %d, want %d", tc.id, got, tc.hash)
		}
		for size, want := range tc.mod {
			if got := HashRank(tc.id, size); got != want || uint64(got) != tc.hash%uint64(size) {
				t.Errorf("HashRank(%q, %d) = %d, want %d", tc.id, size, got, want)
			}
		}
		for _, size := range []int{1, 0, -3} {
			if got := HashRank(tc.id, size); got != 0 {
				t.Errorf("HashRank(%q, %d) = %d, want 0", tc.id, size, got)
			}
		}
	}
}

func TestNewDataParallel(t *testing.T) {
	for _, name := range Names() {
		dp, err := NewDataParallel(name, 1)
		if err != nil || dp.Enabled() || dp.Size() != 1 {
			t.Fatalf("%s, size 1: %+v %v", name, dp, err)
		}
		if _, ok := dp.PrefillRank("req-1"); ok {
			t.Fatalf("%s, size 1 pins the prefill leg", name)
		}
		if _, _, ok := dp.DecodeRank("req-1", json.RawMessage(`{"remote_dp_rank":0}`)); ok {
			t.Fatalf("%s, size 1 pins the decode leg", name)
		}
	}
	for _, size := range []int{0, -1} {
		if _, err := NewDataParallel(NIXL, size); err == nil || !strings.Contains(err.Error(), "at least 1") {
			t.Fatalf("size %d: %v", size, err)
		}
	}
	for _, name := range []string{SGLang, SharedStorage} {
		_, err := NewDataParallel(name, 2)
		if err == nil || !strings.Contains(err.Error(), "only kv-nixl supports data parallelism") || !strings.Contains(err.Error(), name) {
			t.Fatalf("%s, size 2: %v", name, err)
		}
	}
	dp, err := NewDataParallel(NIXL, 8)
	if err != nil || !dp.Enabled() || dp.Size() != 8 {
		t.Fatalf("kv-nixl, size 8: %+v %v", dp, err)
	}
	if rank, ok := dp.PrefillRank("req-1"); !ok || rank != 5 {
		t.Fatalf("PrefillRank(req-1) = %d %v, want 5", rank, ok)
	}
	if (DataParallel{}).Enabled() || (DataParallel{}).Size() != 1 {
		t.Fatal("the zero value pins")
	}
}

func TestDecodeRank(t *testing.T) {
	dp, err := NewDataParallel(NIXL, 8)
	if err != nil {
		t.Fatal(err)
	}
	const id = "req-1" // hashes to 5 of 8
	tests := map[string]struct {
		from     string
		rank     int
		answered bool
	}{
		"valid":               {from: `{"remote_engine_id":"e1","remote_dp_rank":3}`, rank: 3, answered: true},
		"zero":                {from: `{"remote_dp_rank":0}`, rank: 0, answered: true},
		"last":                {from: `{"remote_dp_rank":7}`, rank: 7, answered: true},
		"integral float":      {from: `{"remote_dp_rank":3.0}`, rank: 3, answered: true},
		"exponent":            {from: `{"remote_dp_rank":2e0}`, rank: 2, answered: true},
		"out of range":        {from: `{"remote_dp_rank":8}`, rank: 5},
		"far out of range":    {from: `{"remote_dp_rank":1e300}`, rank: 5},
		"negative":            {from: `{"remote_dp_rank":-1}`, rank: 5},
		"fractional":          {from: `{"remote_dp_rank":3.5}`, rank: 5},
		"string":              {from: `{"remote_dp_rank":"3"}`, rank: 5},
		"bool":                {from: `{"remote_dp_rank":true}`, rank: 5},
		"null":                {from: `{"remote_dp_rank":null}`, rank: 5},
		"object":              {from: `{"remote_dp_rank":{"rank":3}}`, rank: 5},
		"absent":              {from: `{"remote_engine_id":"e1"}`, rank: 5},
		"no answer params":    {rank: 5},
		"non-object params":   {from: `[3]`, rank: 5},
		"invalid JSON params": {from: `{"remote_dp_rank":3`, rank: 5},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var from json.RawMessage
			if tc.from != "" {
				from = json.RawMessage(tc.from)
			}
			rank, answered, ok := dp.DecodeRank(id, from)
			if !ok || rank != tc.rank || answered != tc.answered {
				t.Fatalf("DecodeRank(%s) = %d answered %v ok %v, want %d answered %v", tc.from, rank, answered, ok, tc.rank, tc.answered)
			}
		})
	}
}
