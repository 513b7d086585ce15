package simworker

import (
	"testing"
)

// usageOf is a non-streamed answer's usage.
func usageOf(t *testing.T, r reply) Usage {
	t.Helper()
	return decode[struct {
		Usage Usage `json:"usage"`
	}](t, r.body).Usage
}

// A decode that loaded the prompt's KV reports every prompt token cached, as vLLM counts tokens
// a connector loaded; one that drew FaultRecompute ignores the transfer (the handle stays on the
// prefill worker, unpulled), computes the prompt and reports cached_tokens 0, in every format.
func TestDecodeRecomputeFault(t *testing.T) {
	for _, f := range formats {
		t.Run(f.name, func(t *testing.T) {
			p := startWorker(t, Config{Role: RolePrefill, Name: "p0"})
			d := startWorker(t, Config{Role: RoleDecode, Name: "d0"})
			prefill := func(text string) obj {
				pr := post(t, p, f.path, f.build(text, 1, obj{"do_remote_decode": true, "do_remote_prefill": false}))
				mustStatus(t, pr, 200)
				return kvOf(t, pr)
			}

			loaded := post(t, d, f.path, f.build(prompt, 2, prefill(prompt)))
			mustStatus(t, loaded, 200)
			u := usageOf(t, loaded)
			if u.PromptTokens == 0 || u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens != u.PromptTokens {
				t.Fatalf("a decode that loaded the KV: usage %+v, want all %d prompt tokens cached", u, u.PromptTokens)
			}

			if err := d.InjectFault(Fault{Kind: FaultRecompute}); err != nil {
				t.Fatal(err)
			}
			const other = "jumps over the lazy dog"
			kv := prefill(other)
			recomputed := post(t, d, f.path, f.build(other, 2, kv))
			mustStatus(t, recomputed, 200)
			u = usageOf(t, recomputed)
			if u.PromptTokens == 0 || u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens != 0 || u.CompletionTokens != 2 {
				t.Fatalf("a decode that recomputed: usage %+v (%s), want cached_tokens 0", u, recomputed.body)
			}
			if len(d.Faults()) != 0 {
				t.Fatalf("faults left: %+v", d.Faults())
			}
			// The handle was never pulled: a decode without the fault still loads it.
			again := post(t, d, f.path, f.build(other, 2, kv))
			mustStatus(t, again, 200)
			if u := usageOf(t, again); u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens != u.PromptTokens {
				t.Fatalf("the handle the recompute left: usage %+v", u)
			}
		})
	}
}
