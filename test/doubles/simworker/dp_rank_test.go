package simworker

import (
	"fmt"
	"testing"
)

// A kv-nixl prefill answers the rank its leg was pinned to (X-Data-Parallel-Rank) as
// remote_dp_rank, and no rank without a valid one.
func TestPrefillEchoesDataParallelRank(t *testing.T) {
	p := startWorker(t, Config{Name: "p", Role: RolePrefill, KVConnector: KVNixl})
	leg := completion("a b c", obj{"max_tokens": 1, "kv_transfer_params": obj{"do_remote_decode": true, "do_remote_prefill": false}})
	for _, tc := range []struct {
		header string
		want   string
	}{
		{"3", "3"}, {"0", "0"}, {"", ""}, {"-1", ""}, {"two", ""}, {"1.5", ""},
	} {
		var hdr []string
		if tc.header != "" {
			hdr = []string{DataParallelRankHeader, tc.header}
		}
		r := post(t, p, PathCompletions, leg, hdr...)
		mustStatus(t, r, 200)
		kv := decode[struct {
			KV map[string]any `json:"kv_transfer_params"`
		}](t, r.body).KV
		rank, has := kv["remote_dp_rank"]
		switch {
		case tc.want == "" && has:
			t.Errorf("header %q: remote_dp_rank %v, want none", tc.header, rank)
		case tc.want != "" && fmt.Sprint(rank) != tc.want:
			t.Errorf("header %q: remote_dp_rank %v, want %s", tc.header, rank, tc.want)
		}
	}
}
