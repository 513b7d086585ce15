package kv

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"

	"golang.org/x/crypto/blake2s"

	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// DataParallelRankHeader pins a request to one data-parallel rank of a model server (vLLM and
// SGLang read it case-insensitively).
const DataParallelRankHeader = "X-Data-Parallel-Rank"

// ParamDataParallelSize is the step param (prefill, decode) naming the model servers'
// data-parallel size.
const ParamDataParallelSize = "data_parallel_size"

// remoteDPRankField is the kv_transfer_params key in which a prefill worker may report the
// data-parallel rank it ran on.
const remoteDPRankField = "remote_dp_rank"

// DataParallel pins both legs of a disaggregated pair to one data-parallel rank: a server with
// data_parallel_size > 1 whose ranks share one HTTP port (SO_REUSEPORT) would otherwise let the
// kernel hand the prefill and the decode request of one pair to different ranks. The prefill leg
// carries X-Data-Parallel-Rank = blake2s-256(request id) mod size; the decode leg the rank the
// prefill worker answered (kv_transfer_params.remote_dp_rank) when valid, else the same hash. As
// upstream (llm-d-router connectors/kv/dp_rank.go). The zero value pins nothing.
type DataParallel struct{ size int }

// NewDataParallel returns the rank pinning of a step whose KV connector is connector and whose
// data_parallel_size is size. size must be at least 1; only kv-nixl accepts more than 1.
// (Upstream accepts any size with the other connectors and ignores it; a setting that would do
// nothing is an error here.)
func NewDataParallel(connector string, size int) (DataParallel, error) {
	if size < 1 {
		return DataParallel{}, fmt.Errorf("must be at least 1, got %d", size)
	}
	if size > 1 && connector != NIXL {
		return DataParallel{}, fmt.Errorf("only %s supports data parallelism (kv_connector is %q); remove %s or set it to 1",
			NIXL, connector, ParamDataParallelSize)
	}
	return DataParallel{size: size}, nil
}

// Size is the data-parallel size (1 for the zero value).
func (d DataParallel) Size() int { return max(d.size, 1) }

// Enabled reports whether legs are pinned (a size above 1).
func (d DataParallel) Enabled() bool { return d.size > 1 }

// PrefillRank returns the rank of requestID's prefill leg, HashRank(requestID, size); ok is false
// when nothing is pinned.
func (d DataParallel) PrefillRank(requestID string) (rank int, ok bool) {
	if !d.Enabled() {
		return 0, false
	}
	return HashRank(requestID, d.size), true
}

// DecodeRank returns the rank of the decode leg that follows a prefill whose answer carried
// fromPrefill (its kv_transfer_params, nil when none): remote_dp_rank when it is an integer in
// [0, size) (an integral float such as 3.0 included), else HashRank(requestID, size), the prefill
// leg's own rank. answered reports that the prefill answer's rank was used; ok is false when
// nothing is pinned.
func (d DataParallel) DecodeRank(requestID string, fromPrefill json.RawMessage) (rank int, answered, ok bool) {
	if !d.Enabled() {
		return 0, false, false
	}
	if r, valid := answeredRank(fromPrefill, d.size); valid {
		return r, true, true
	}
	return HashRank(requestID, d.size), false, true
}

// answeredRank reads remote_dp_rank from a prefill answer's kv_transfer_params.
func answeredRank(fromPrefill json.RawMessage, size int) (int, bool) {
	if body.KindOf(fromPrefill) != body.KindObject {
		return 0, false
	}
	o, err := body.Parse(fromPrefill)
	if err != nil {
		return 0, false
	}
	raw, present := o.Get(remoteDPRankField)
	if !present || body.KindOf(raw) != body.KindNumber {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != math.Trunc(f) || f < 0 || f >= float64(size) {
		return 0, false
	}
	return int(f), true
}

// HashRank is the deterministic rank of requestID among size ranks: the first 8 bytes of
// blake2s-256(requestID), big-endian, mod size (0 when size <= 1).
func HashRank(requestID string, size int) int {
	if size <= 1 {
		return 0
	}
	sum := blake2s.Sum256([]byte(requestID))
	return int(binary.BigEndian.Uint64(sum[:8]) % uint64(size))
}
