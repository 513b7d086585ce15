package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/option"

	"github.com/epd-dev/coordinator/test/doubles/gateway"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

const hintedPipeline = "    - type: conditional-decode\n      params: {hints: true}\n    - type: prefill\n    - type: decode\n"

// The picker's 412 names the prefill pick (RFC llm-d-router#2178's x-prefill-host-port); the
// prefill leg is pinned to it instead of being scheduled again blind.
func TestConditionalDecodeHintsSteerPrefill(t *testing.T) {
	for _, hints := range []bool{true, false} {
		t.Run(fmt.Sprintf("hints=%v", hints), func(t *testing.T) {
			pipe := hintedPipeline
			if !hints {
				pipe = strings.Replace(pipe, "{hints: true}", "{hints: false}", 1)
			}
			s := start(t, stack.Options{Prefillers: 2, Gateway: gateway.Config{EPPConditionalDecode: true, Hints: true}}, "kv-nixl", "ec-nixl", true, pipe)
			prefillPods := map[string]int{}
			for i := range 4 {
				var httpResp *http.Response
				resp, err := s.client.Chat.Completions.New(context.Background(), chatParams(fmt.Sprintf("hinted prompt %d", i), 2), option.WithResponseInto(&httpResp))
				if err != nil || resp.Choices[0].Message.Content != "hinted prompt" {
					t.Fatalf("answer %v %v", resp, err)
				}
				legs := s.legsFor(httpResp.Header.Get("X-Request-Id"))
				if got := profiles(legs); got != "decode:412,prefill:200,decode:200" {
					t.Fatalf("legs %s", got)
				}
				hint := legs[0].Hints["prefill"]
				first, _, _ := strings.Cut(hint, ",")
				if strings.Count(hint, ",") != 1 {
					t.Fatalf("412 hinted %q, want both prefill pods", hint)
				}
				if hints && (legs[1].Pin != first || host(t, legs[1].Backend) != first) || !hints && legs[1].Pin != "" {
					t.Fatalf("prefill leg pin %q backend %s, 412 hinted %q", legs[1].Pin, legs[1].Backend, hint)
				}
				prefillPods[legs[1].Backend]++
			}
			// The picker hints its best pick first (the pool's first pod for new prompts): with
			// hints every prefill goes there; without, the gateway's rotation spreads them.
			if want := map[bool]int{true: 1, false: 2}[hints]; len(prefillPods) != want {
				t.Fatalf("prefill legs went to %v", prefillPods)
			}
		})
	}
}

// A stale hint (its pod died after the 412) costs one refused attempt: the retry goes unpinned.
func TestStaleHintIsRetriedUnpinned(t *testing.T) {
	s := start(t, stack.Options{Prefillers: 2, Gateway: gateway.Config{EPPConditionalDecode: true, Hints: true}}, "kv-nixl", "ec-nixl", true, hintedPipeline)
	s.stack.Prefill[0].Kill() // the pod the picker hints first: its ejection comes with the first failure
	var httpResp *http.Response
	resp, err := s.client.Chat.Completions.New(context.Background(), chatParams("stale hint", 2), option.WithResponseInto(&httpResp))
	if err != nil || resp.Choices[0].Message.Content != "stale hint" {
		t.Fatalf("answer %v %v", resp, err)
	}
	legs := s.legsFor(httpResp.Header.Get("X-Request-Id"))
	if got := profiles(legs); got != "decode:412,prefill:503,prefill:200,decode:200" {
		t.Fatalf("legs %s", got)
	}
	if legs[1].Pin == "" || legs[2].Pin != "" || legs[2].Backend != s.stack.Prefill[1].URL() {
		t.Fatalf("prefill attempts %+v then %+v", legs[1], legs[2])
	}
}
