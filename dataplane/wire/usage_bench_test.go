package wire

import (
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// benchAnswer is a simworker chat answer of 16 tokens with usage.
var benchAnswer = []byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1796171844,"model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":"Write a haiku about disaggregated inference please Write a haiku about disaggregated inference please"},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":17,"completion_tokens":16,"total_tokens":33,"prompt_tokens_details":{"cached_tokens":17}}}`)

// BenchmarkReadStats is the metrics' read of a whole chat answer (its model and usage),
// once per non-streamed request: ~6 µs and 12 allocations on the 2-vCPU development machine,
// most of it the validation of the answer (docs/benchmarks.md, the 200 B profile).
func BenchmarkReadStats(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		var a request.AnswerStats
		ReadStats(&a, benchAnswer)
	}
}
