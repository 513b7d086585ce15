package simworker

import "testing"

func TestKVHandleRoundTrip(t *testing.T) {
	tests := []struct {
		name     string
		h        kvHandle
		id       string
		engineID string
	}{
		{"one block", kvHandle{firstBlock: 0, numBlocks: 1, promptKey: "k1", numTokens: 3}, "p-kv-1-abcd", "p-engine-1"},
		{"many blocks", kvHandle{firstBlock: 4096, numBlocks: 2731, promptKey: PromptKey([]int{1, 2}), numTokens: 43681}, "p-kv-2", "e"},
		{"names to escape", kvHandle{firstBlock: 7, numBlocks: 2, promptKey: "k", numTokens: 20}, `a"<b>-kv-3`, `a"<b>-engine-\x`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			blocks := tt.h.blockIDs()
			if len(blocks) != tt.h.numBlocks || blocks[0] != tt.h.firstBlock || blocks[len(blocks)-1] != tt.h.firstBlock+tt.h.numBlocks-1 {
				t.Fatalf("blocks of %+v = %v", tt.h, blocks)
			}
			want := mustJSON(t, KVHandle{RemoteRequestID: tt.id, RemoteEngineID: tt.engineID, RemoteBlockIDs: [][]int{blocks},
				PromptKey: tt.h.promptKey, NumTokens: tt.h.numTokens})
			answer := tt.h.appendJSON(nil, tt.id, tt.engineID)
			if string(answer) != string(want) {
				t.Fatalf("appendJSON = %.200s, want %.200s", answer, want)
			}
			got, err := parseKVHandle(answer)
			if err != nil {
				t.Fatal(err)
			}
			if string(mustJSON(t, got)) != string(want) {
				t.Errorf("parseKVHandle = %+v, want %s", got, want)
			}
		})
	}
	for _, bad := range []string{`[]`, `{"remote_block_ids":[1]}`, `{"remote_engine_id":5}`, `{`} {
		if _, err := parseKVHandle([]byte(bad)); err == nil {
			t.Errorf("parseKVHandle(%s) succeeded", bad)
		}
	}
}
