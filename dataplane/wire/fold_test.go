package wire

import "testing"

// fold folds a whole stream of f's events.
func fold(f Format, events string) ([]byte, error) {
	fd := f.Events().Fold()
	if err := fd.Add([]byte(events)); err != nil {
		return nil, err
	}
	return fd.Answer()
}

func TestFoldCompletionsAndGenerate(t *testing.T) {
	text := "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"created\":3,\"model\":\"m\",\"choices\":[{\"index\":0,\"text\":\"a\",\"finish_reason\":null}]}\n\n" +
		"data: {\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\" b\",\"finish_reason\":\"length\"}]}\n\n" +
		"data: {\"id\":\"cmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,\"total_tokens\":3}}\n\ndata: [DONE]\n\n"
	out, err := fold(Completions, text)
	if err != nil || string(out) != `{"choices":[{"finish_reason":"length","index":0,"logprobs":null,"text":"a b"}],"created":3,"id":"cmpl-1","model":"m","object":"text_completion","usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}` {
		t.Fatalf("completions %s %v", out, err)
	}
	gen := "data: {\"request_id\":\"g\",\"choices\":[{\"index\":0,\"token_ids\":[5],\"finish_reason\":null}]}\n\n" +
		"data: {\"request_id\":\"g\",\"choices\":[{\"index\":0,\"token_ids\":[6,7],\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n"
	out, err = fold(Generate, gen)
	if err != nil || string(out) != `{"choices":[{"finish_reason":"length","index":0,"token_ids":[5,6,7]}],"kv_transfer_params":null,"prompt_logprobs":null,"request_id":"g"}` {
		t.Fatalf("generate %s %v", out, err)
	}
}
