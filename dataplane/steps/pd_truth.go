package steps

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// Params of the P/D truth check (the decode step; prefill-decode is not judged).
const (
	// paramStrictKVTransfer fails a request whose decode answer shows it recomputed the prompt.
	paramStrictKVTransfer = "strict_kv_transfer"
	// paramKVMinCachedPercent is the share of the prompt a decode answer's cached_tokens must
	// reach for the KV to count as moved.
	paramKVMinCachedPercent = "kv_min_cached_percent"
	// defaultKVMinCachedPercent leaves room for the tokens a worker computes itself after a
	// full transfer: the last token (vLLM), a partial last block (the llm-d simulator's cache
	// counts whole blocks of 16), while a decode that recomputed reports none of its own prompt
	// cached, or only what its own prefix cache held.
	defaultKVMinCachedPercent = 50
)

// ErrCodeKVRecomputed is the error code a client gets for a request strict_kv_transfer failed.
const ErrCodeKVRecomputed = "kv_transfer_recomputed"

// kvTruth judges, from the decode answer's usage, whether the KV the prefill computed reached
// the decode worker (coordinator_pd_requests_total) and, with strict_kv_transfer, fails a
// request whose decode recomputed the prompt instead.
type kvTruth struct {
	metrics    *observe.Metrics
	minPercent int64
	strict     bool
}

// newKVTruth reads strict_kv_transfer and kv_min_cached_percent (1 to 100).
func newKVTruth(deps builder.Deps, p *params.Params) kvTruth {
	pct := p.Int(paramKVMinCachedPercent, defaultKVMinCachedPercent, 1)
	if pct > 100 {
		p.Fail(paramKVMinCachedPercent, "%d is more than 100 (percent of the prompt's tokens)", pct)
	}
	return kvTruth{metrics: deps.Telemetry.Metrics, minPercent: int64(pct), strict: p.Bool(paramStrictKVTransfer, false)}
}

// outcome is the observe.PD* outcome of a decode answer a: prefilled says a prefill ran for
// the request, sentKV that the decode leg that answered carried its kv_transfer_params.
func (k kvTruth) outcome(prefilled, sentKV bool, a request.AnswerStats) string {
	switch {
	case !prefilled:
		return observe.PDAggregated
	case !sentKV:
		return observe.PDRecomputed // sent without the transfer (a retry after a failed one): computed again by design
	case !a.HasUsage || !a.HasCached || a.PromptTokens == 0:
		return observe.PDUnverified
	case a.CachedTokens*100 >= k.minPercent*a.PromptTokens:
		return observe.PDDisaggregated
	}
	return observe.PDRecomputed
}

// count records a served decode answer's outcome.
func (k kvTruth) count(rc *request.Context, sentKV bool) {
	k.metrics.PD(k.outcome(rc.Prefilled, sentKV, rc.Answer))
}

// verifier is the relay.Target Verify of a decode leg that carried the prefill's KV, with
// strict_kv_transfer: an answer whose usage shows the prompt recomputed fails the request with
// a 502 (counted as recomputed); nil without strict_kv_transfer. An answer that says nothing of
// cached tokens passes: there is no evidence either way.
func (k kvTruth) verifier() func(*request.Context) error {
	if !k.strict {
		return nil
	}
	return func(rc *request.Context) error {
		if k.outcome(true, true, rc.Answer) != observe.PDRecomputed {
			return nil
		}
		k.metrics.PD(observe.PDRecomputed)
		msg := fmt.Sprintf("the decode worker recomputed the prompt instead of loading the prefill's KV (cached_tokens %d of %d prompt tokens, below %d%%); strict_kv_transfer fails such a request",
			rc.Answer.CachedTokens, rc.Answer.PromptTokens, k.minPercent)
		// The cause is the decode worker's answer (a 200 the request cannot use): logged as an
		// upstream failure, its llm-d error code upstream_5xx.
		return &apierror.Error{Status: http.StatusBadGateway, Type: apierror.TypeAPI, Code: ErrCodeKVRecomputed, Message: msg,
			Cause: &apierror.UpstreamError{Phase: DecodeStep, Status: http.StatusOK, Err: errors.New(msg)}}
	}
}
