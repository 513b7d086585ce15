package renderref_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/render"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// TestHistoryTurnByTurn renders every chat case of the corpus that has more than one user turn,
// turn by turn (its messages up to each user message, with the generation prompt, as a client
// sends a conversation), with the rendered-history cache and without any cache, for every family
// of models: the ids (and the errors) must be the same at every turn. It adds conversations made
// of the corpus's messages, longer than its cases, so that each turn has a long history to reuse.
// The messages the template is given are decoded or found decoded, its iterations over them run
// or replayed, and the ids encoded or reused: all show in the ids.
func TestHistoryTurnByTurn(t *testing.T) {
	cases := loadCorpus(t)["chat"]
	dirs := modelDirs(t)
	for i, m := range models {
		t.Run(m.name, func(t *testing.T) {
			plain, err := render.Open(dirs[i], render.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(plain.Close)
			cached, err := render.Open(dirs[i], render.Options{HistoryBytes: 64 << 20, CacheBytes: 64 << 20})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cached.Close)
			convs, turns := 0, 0
			check := func(name string, cs corpusCase, msgs []json.RawMessage) {
				multi := false
				for k, users := 1, 0; k <= len(msgs); k++ {
					var head struct{ Role string }
					_ = json.Unmarshal(msgs[k-1], &head)
					if head.Role != "user" {
						continue
					}
					if users++; users > 1 {
						multi = true
					}
					raw, _ := json.Marshal(msgs[:k])
					req := render.ChatRequest{Messages: raw, Tools: cs.Tools, Kwargs: cs.Kwargs, AddGenerationPrompt: true}
					want, werr := plain.Chat(nil, req)
					toks, gerr := cached.ChatTokens(req)
					got, js := toks.AppendIDs(nil), bytes.Join(toks.JSON, nil)
					switch {
					case (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()):
						t.Errorf("%s, turn of %d messages: error %v, without the cache %v", name, k, gerr, werr)
					case !slices.Equal(got, want):
						t.Errorf("%s, turn of %d messages: ids differ from the uncached render %s", name, k, idsDiff(loadVocab(t, dirs[i]), want, got))
					case gerr == nil && string(js) != string(body.AppendInts(nil, want)):
						t.Errorf("%s, turn of %d messages: the ids' JSON is not theirs: %.80s...", name, k, js)
					}
					turns++
				}
				if multi {
					convs++
				}
			}
			for _, cs := range cases {
				var msgs []json.RawMessage
				if err := json.Unmarshal(cs.Messages, &msgs); err != nil {
					t.Fatalf("%s: %v", cs.Name, err)
				}
				check(cs.Name, cs, msgs)
			}
			// Long conversations of the corpus's plain user and assistant messages (no tools:
			// their calls need the tools of their own case), 12 turns each.
			var users, answers []json.RawMessage
			for _, cs := range cases {
				if len(cs.Tools) > 0 || len(cs.Kwargs) > 0 {
					continue
				}
				var msgs []json.RawMessage
				_ = json.Unmarshal(cs.Messages, &msgs)
				for _, msg := range msgs {
					var head struct {
						Role      string
						ToolCalls json.RawMessage `json:"tool_calls"`
					}
					_ = json.Unmarshal(msg, &head)
					switch {
					case head.Role == "user":
						users = append(users, msg)
					case head.Role == "assistant" && len(head.ToolCalls) == 0:
						answers = append(answers, msg)
					}
				}
			}
			r := rand.New(rand.NewPCG(31, 4))
			for c := range 20 {
				var msgs []json.RawMessage
				for range 12 {
					msgs = append(msgs, users[r.IntN(len(users))], answers[r.IntN(len(answers))])
				}
				check(fmt.Sprintf("synthesized/%d", c), corpusCase{}, msgs)
			}
			hits, misses, tokens, bytes := cached.HistoryStats()
			t.Logf("%d multi-turn conversations, %d turns: history hits %d, misses %d, %d tokens reused, %d bytes held", convs, turns, hits, misses, tokens, bytes)
			if convs < 300 || hits == 0 || tokens == 0 {
				t.Fatalf("%d multi-turn conversations and %d hits: the cache was not exercised", convs, hits)
			}
			// Every family's template only reads its messages: a later turn finds them decoded.
			if mh, mm, _, _ := cached.DecodedStats(); mh < uint64(turns) || mm == 0 {
				t.Fatalf("messages found decoded %d times, decoded %d, over %d turns: the decoded messages were not shared", mh, mm, turns)
			}
			// ... and each later turn replays the template's iterations over the messages it had.
			replayed, ran := cached.IterationStats()
			t.Logf("template iterations replayed %d, run %d", replayed, ran)
			if replayed < uint64(turns) || ran == 0 {
				t.Fatalf("template iterations replayed %d times, run %d, over %d turns: the iterations were not replayed", replayed, ran, turns)
			}
		})
	}
}
