package steps

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

func TestKVTruthOutcome(t *testing.T) {
	usage := func(prompt, cached int64) request.AnswerStats {
		return request.AnswerStats{HasUsage: true, PromptTokens: prompt, CompletionTokens: 1, CachedTokens: cached, HasCached: true}
	}
	tests := map[string]struct {
		prefilled, sentKV bool
		answer            request.AnswerStats
		want              string
	}{
		"no prefill: aggregated":                    {answer: usage(10, 0), want: observe.PDAggregated},
		"every prompt token cached":                 {prefilled: true, sentKV: true, answer: usage(38, 38), want: observe.PDDisaggregated},
		"whole blocks cached (the llm-d simulator)": {prefilled: true, sentKV: true, answer: usage(38, 32), want: observe.PDDisaggregated},
		"exactly the share":                         {prefilled: true, sentKV: true, answer: usage(10, 5), want: observe.PDDisaggregated},
		"below the share":                           {prefilled: true, sentKV: true, answer: usage(10, 4), want: observe.PDRecomputed},
		"cached_tokens 0":                           {prefilled: true, sentKV: true, answer: usage(38, 0), want: observe.PDRecomputed},
		"sent without the transfer":                 {prefilled: true, answer: usage(38, 38), want: observe.PDRecomputed},
		"no usage":                                  {prefilled: true, sentKV: true, want: observe.PDUnverified},
		"usage without prompt_tokens_details":       {prefilled: true, sentKV: true, answer: request.AnswerStats{HasUsage: true, PromptTokens: 9}, want: observe.PDUnverified},
		"an empty prompt says nothing":              {prefilled: true, sentKV: true, answer: usage(0, 0), want: observe.PDUnverified},
	}
	k := kvTruth{minPercent: defaultKVMinCachedPercent}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := k.outcome(tc.prefilled, tc.sentKV, tc.answer); got != tc.want {
				t.Fatalf("outcome %q, want %q", got, tc.want)
			}
		})
	}
}

func TestKVTruthParams(t *testing.T) {
	tests := map[string]struct {
		own     map[string]any
		want    kvTruth
		wantErr string
	}{
		"defaults":          {want: kvTruth{minPercent: defaultKVMinCachedPercent}},
		"strict, 90%":       {own: map[string]any{paramStrictKVTransfer: true, paramKVMinCachedPercent: 90}, want: kvTruth{minPercent: 90, strict: true}},
		"100% is allowed":   {own: map[string]any{paramKVMinCachedPercent: 100}, want: kvTruth{minPercent: 100}},
		"above 100":         {own: map[string]any{paramKVMinCachedPercent: 101}, wantErr: "kv_min_cached_percent"},
		"0 is below 1":      {own: map[string]any{paramKVMinCachedPercent: 0}, wantErr: "kv_min_cached_percent"},
		"strict not a bool": {own: map[string]any{paramStrictKVTransfer: "yes"}, wantErr: "strict_kv_transfer"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := params.New("pipeline.steps[1]", tc.own, nil)
			got := newKVTruth(builder.Deps{}, p)
			err := p.Err()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// With strict_kv_transfer the verifier refuses an answer that shows the prompt recomputed, with a
// 502 naming the counts, and passes one that shows the KV moved or says nothing; without it
// there is none.
func TestKVTruthVerifier(t *testing.T) {
	if (kvTruth{minPercent: 50}).verifier() != nil {
		t.Fatal("a verifier without strict_kv_transfer")
	}
	verify := kvTruth{minPercent: 50, strict: true}.verifier()
	pass := []request.AnswerStats{{HasUsage: true, PromptTokens: 8, CachedTokens: 8, HasCached: true}, {HasUsage: true, PromptTokens: 8}, {}}
	for _, a := range pass {
		if err := verify(&request.Context{Answer: a}); err != nil {
			t.Fatalf("%+v: %v", a, err)
		}
	}
	err := verify(&request.Context{Answer: request.AnswerStats{HasUsage: true, PromptTokens: 8, CachedTokens: 1, HasCached: true}})
	var e *apierror.Error
	if !errors.As(err, &e) || e.Status != http.StatusBadGateway || e.Code != ErrCodeKVRecomputed || !strings.Contains(e.Message, "cached_tokens 1 of 8") {
		t.Fatalf("got %v", err)
	}
	if code := observe.ErrorCode(err, 0); code != observe.ErrUpstream5xx {
		t.Fatalf("llm-d error code %q, want %q: the decode worker's answer failed it", code, observe.ErrUpstream5xx)
	}
}
