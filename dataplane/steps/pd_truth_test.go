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
	"github.com/epd-dev/coordinator/dataplane/wire"
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

// The usage shapes of the workers in the field, read as the relay reads them (wire.ReadStats)
// and judged after a prefill whose transfer the decode leg carried. The llm-d simulator
// (llm-d-inference-sim eec055a, run with --enable-kvcache) always reports
// prompt_tokens_details.cached_tokens, counting whole blocks of 16 of its own prefix cache, and 0
// on a decode leg with do_remote_prefill: it does not model the KV's arrival, so its P/D answers
// count as recomputed. vLLM reports the details only with --enable-prompt-tokens-details.
func TestKVTruthUsageShapes(t *testing.T) {
	tests := map[string]struct {
		answers []string // one answer, or a stream's events
		want    string
	}{
		"llm-d simulator, P/D decode": {answers: []string{`{"id":"chatcmpl-1","object":"chat.completion","usage":{"prompt_tokens":29,"completion_tokens":24,"total_tokens":53,"prompt_tokens_details":{"cached_tokens":0}},"choices":[]}`},
			want: observe.PDRecomputed},
		"llm-d simulator, whole blocks of its prefix cache": {answers: []string{`{"object":"chat.completion","usage":{"prompt_tokens":38,"completion_tokens":33,"total_tokens":71,"prompt_tokens_details":{"cached_tokens":32}},"choices":[]}`},
			want: observe.PDDisaggregated},
		"vLLM with --enable-prompt-tokens-details, the KV loaded": {answers: []string{`{"object":"chat.completion","choices":[],"usage":{"prompt_tokens":512,"total_tokens":528,"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":511}}}`},
			want: observe.PDDisaggregated},
		"vLLM without it": {answers: []string{`{"object":"chat.completion","choices":[],"usage":{"prompt_tokens":512,"total_tokens":528,"completion_tokens":16,"prompt_tokens_details":null}}`},
			want: observe.PDUnverified},
		"vLLM stream: the usage chunk last": {answers: []string{`{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}`,
			`{"object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":512,"completion_tokens":16,"total_tokens":528,"prompt_tokens_details":{"cached_tokens":0}}}`},
			want: observe.PDRecomputed},
		"completions": {answers: []string{`{"object":"text_completion","choices":[],"usage":{"prompt_tokens":20,"completion_tokens":4,"total_tokens":24,"prompt_tokens_details":{"cached_tokens":20}}}`},
			want: observe.PDDisaggregated},
		"Responses API": {answers: []string{`{"type":"response.completed","response":{"object":"response","usage":{"input_tokens":20,"output_tokens":4,"input_tokens_details":{"cached_tokens":3}}}}`},
			want: observe.PDRecomputed},
	}
	k := kvTruth{minPercent: defaultKVMinCachedPercent}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var a request.AnswerStats
			for _, doc := range tc.answers {
				wire.ReadStats(&a, []byte(doc))
			}
			if got := k.outcome(true, true, a); got != tc.want {
				t.Fatalf("outcome %q of %+v, want %q", got, a, tc.want)
			}
		})
	}
}
