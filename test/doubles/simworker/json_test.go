package simworker

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestParseObject(t *testing.T) {
	tests := []struct {
		name     string
		data     string
		wantKeys []string
		wantErr  string
	}{
		{"object", ` {"a":1, "b" : [2]} `, []string{"a", "b"}, ""},
		{"null is empty", ` null `, nil, ""},
		{"syntax error worded by encoding/json", `{"a":`, nil, "unexpected end of JSON input"},
		{"trailing data", `{} x`, nil, "invalid character 'x' after top-level value"},
		{"not an object", `[1]`, nil, "must be a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseObject([]byte(tt.data))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, f := range o.Fields() {
				keys = append(keys, f.Key)
			}
			if !slices.Equal(keys, tt.wantKeys) {
				t.Errorf("keys = %q, want %q", keys, tt.wantKeys)
			}
		})
	}
}

// TestFieldsMatchEncodingJSON checks the typed reads against encoding/json
// decoding the same object into the struct the worker used to unmarshal into.
func TestFieldsMatchEncodingJSON(t *testing.T) {
	type target struct {
		Model     string           `json:"model"`
		MaxTokens *int             `json:"max_tokens"`
		Stream    bool             `json:"stream"`
		TokenIDs  []int            `json:"token_ids"`
		KV        rawParams        `json:"kv_transfer_params"`
		Options   *struct{ X int } `json:"stream_options"`
	}
	tests := []struct {
		name    string
		data    string
		wantErr bool
	}{
		{"all set", `{"model":"m","max_tokens":3,"stream":true,"token_ids":[1, 2 ,3],"kv_transfer_params":{"a":[1],"b":null}}`, false},
		{"nulls", `{"model":null,"max_tokens":null,"stream":null,"token_ids":null,"kv_transfer_params":null,"stream_options":null}`, false},
		{"absent", `{}`, false},
		{"escaped string", `{"model":"a\"b\u00e9\n"}`, false},
		{"case-insensitive keys", `{"MODEL":"m","Max_Tokens":2,"STREAM":true}`, false},
		{"last duplicate wins", `{"model":"a","model":"b","max_tokens":1,"max_tokens":2}`, false},
		{"empty arrays and objects", `{"token_ids":[ ],"kv_transfer_params":{}}`, false},
		{"null token", `{"token_ids":[1,null,-3]}`, false},
		{"negative zero", `{"max_tokens":-0}`, false},
		{"float max_tokens", `{"max_tokens":1.0}`, true},
		{"exponent max_tokens", `{"max_tokens":1e2}`, true},
		{"overflowing max_tokens", `{"max_tokens":99999999999999999999}`, true},
		{"string max_tokens", `{"max_tokens":"1"}`, true},
		{"number model", `{"model":1}`, true},
		{"string stream", `{"stream":"true"}`, true},
		{"float token", `{"token_ids":[1,2.5]}`, true},
		{"nested token", `{"token_ids":[[1]]}`, true},
		{"string token", `{"token_ids":["1"]}`, true},
		{"array params", `{"kv_transfer_params":[]}`, true},
		{"string object", `{"stream_options":"x"}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want target
			jerr := json.Unmarshal([]byte(tt.data), &want)
			if (jerr != nil) != tt.wantErr {
				t.Fatalf("encoding/json err = %v, wantErr %v", jerr, tt.wantErr)
			}
			o, err := parseObject([]byte(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			var ferr error
			f := topFields(o, &ferr)
			got := target{
				Model:     f.str("model"),
				MaxTokens: f.integer("max_tokens"),
				Stream:    f.boolean("stream"),
				TokenIDs:  f.ints("token_ids"),
				KV:        f.params("kv_transfer_params"),
			}
			f.object("stream_options")
			if (ferr != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", ferr, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if got.Model != want.Model || got.Stream != want.Stream || !slices.Equal(got.TokenIDs, want.TokenIDs) ||
				(got.TokenIDs == nil) != (want.TokenIDs == nil) || (got.MaxTokens == nil) != (want.MaxTokens == nil) ||
				got.MaxTokens != nil && *got.MaxTokens != *want.MaxTokens {
				t.Errorf("got %+v, want %+v", got, want)
			}
			if (got.KV == nil) != (want.KV == nil) || len(got.KV) != len(want.KV) {
				t.Fatalf("params = %q, want %q", got.KV, want.KV)
			}
			for k, v := range want.KV {
				if string(got.KV[k]) != string(v) {
					t.Errorf("params[%s] = %s, want %s", k, got.KV[k], v)
				}
			}
		})
	}
}

func TestFieldsKeepFirstError(t *testing.T) {
	o, err := parseJSON([]byte(`{"a":1,"b":"x","c":{"d":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	var ferr error
	f := topFields(o, &ferr)
	f.str("a")
	if got := f.object("c").boolean("d"); got {
		t.Error("read after an error returned a value")
	}
	f.integer("b")
	if ferr == nil || ferr.Error() != "a must be a string" {
		t.Errorf("err = %v, want the first one", ferr)
	}
	ferr = nil
	f.object("c").str("d")
	if ferr == nil || ferr.Error() != "c.d must be a string" {
		t.Errorf("nested err = %v", ferr)
	}
}

func TestJSONInts(t *testing.T) {
	tests := []struct {
		raw     string
		want    []int
		wantErr bool
	}{
		{`[]`, []int{}, false},
		{"[ \t\n]", []int{}, false},
		{`[7]`, []int{7}, false},
		{"[ 1 ,\n2,\t-3 , null ]", []int{1, 2, -3, 0}, false},
		{`[9223372036854775807]`, []int{9223372036854775807}, false},
		{`null`, nil, false},
		{`[9223372036854775808]`, nil, true},
		{`[1.5]`, nil, true},
		{`[1e3]`, nil, true},
		{`[true]`, nil, true},
		{`["1"]`, nil, true},
		{`[{"a":1}]`, nil, true},
		{`{"a":1}`, nil, true},
	}
	for _, tt := range tests {
		got, err := jsonInts([]byte(tt.raw), "ids")
		if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
			t.Errorf("jsonInts(%s) = %v, %v; want %v (error %v)", tt.raw, got, err, tt.want, tt.wantErr)
		}
	}
}
