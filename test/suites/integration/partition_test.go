package integration

import (
	"context"
	"net/http"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

// cache_salt, prompt_cache_key and the model reach every phase unchanged, the conditional-decode
// probe included, in both leg formats: the workers (whose prefix cache and KV handles the salt
// partitions, as vLLM's does) serve a salted prompt from the cache only to the same salt, and a
// prefill and decode of one request always agree on it.
func TestCacheSaltPartitionsEveryPhase(t *testing.T) {
	for _, openaiFormat := range []bool{true, false} {
		t.Run(map[bool]string{true: "openai legs", false: "tokens-in legs"}[openaiFormat], func(t *testing.T) {
			s := start(t, stack.Options{}, "kv-nixl", "ec-nixl", openaiFormat, fullPipeline)
			image := dataURL(mediaserver.PNG("a"))
			ask := func(salt, key string) string {
				t.Helper()
				p := imageChat("same prompt for everyone", 3, image)
				var httpResp *http.Response
				opts := []option.RequestOption{option.WithResponseInto(&httpResp)}
				if salt != "" {
					opts = append(opts, option.WithJSONSet("cache_salt", salt))
				}
				if key != "" {
					p.PromptCacheKey = openai.String(key)
				}
				if _, err := s.client.Chat.Completions.New(context.Background(), p, opts...); err != nil {
					t.Fatal(err)
				}
				return profiles(s.legsFor(httpResp.Header.Get("X-Request-Id")))
			}
			const miss, hit = "decode:412,encode:200,prefill:200,decode:200", "decode:200"
			for i, tc := range []struct{ salt, key, want string }{
				{"tenant-a", "user-a", miss},
				{"tenant-a", "user-a", hit},
				{"tenant-b", "user-b", miss}, // the same prompt: tenant-a's cache is not tenant-b's
				{"tenant-b", "user-b", hit},
				{"", "", miss}, // nor an unsalted request's
			} {
				if got := ask(tc.salt, tc.key); got != tc.want {
					t.Fatalf("request %d (salt %q): legs %s, want %s", i, tc.salt, got, tc.want)
				}
			}
			// Every leg the workers got carried its request's salt, key and model.
			bySalt := map[string]int{}
			for _, w := range append(append(append([]*simworker.Worker{}, s.stack.Encode...), s.stack.Prefill...), s.stack.Decode...) {
				for _, b := range received(t, w) {
					salt, _ := b["cache_salt"].(string)
					key, _ := b["prompt_cache_key"].(string)
					if want := map[string]string{"tenant-a": "user-a", "tenant-b": "user-b", "": ""}[salt]; key != want || b["model"] != "sim-model" {
						t.Fatalf("%s got salt %q with key %q, model %v", w.Name(), salt, key, b["model"])
					}
					bySalt[salt]++
				}
			}
			if bySalt["tenant-a"] != 5 || bySalt["tenant-b"] != 5 || bySalt[""] != 4 {
				t.Fatalf("legs by salt %v, want 5 (a miss's four and a hit's one), 5 and 4", bySalt)
			}
		})
	}
}
