package simworker

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// The worker's reading of JSON validates as encoding/json does, and an object it splits
// re-assembles to the same value.
func FuzzJSONScan(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, `{"a":1,"b":[true,false,null],"c":{"d":"e\u00e9\n"}}`, `{"a":-0.5e+7,"b":"\\\"","a":2}`,
		`[1,2,3`, `{"a" 1}`, `{"a":01}`, `{"a":"x` + "\x01" + `"}`, `"\u12"`, ` null `, `{"k\u0041":1}`, `1e`, `-`, `{"a":[{}]}`,
		strings.Repeat("[", 100) + strings.Repeat("]", 100), `"` + strings.Repeat("abcdefgh", 9) + `"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("validJSON(%q) = %v, encoding/json says %v", b, got, want)
		}
		if !json.Valid(b) {
			return
		}
		o, err := splitObject(b)
		if err != nil {
			return // not an object
		}
		var whole, parts map[string]any
		if err := json.Unmarshal(b, &whole); err != nil {
			t.Fatal(err)
		}
		var sb strings.Builder
		sb.WriteByte('{')
		for i, f := range o.Fields() {
			if i > 0 {
				sb.WriteByte(',')
			}
			k, _ := json.Marshal(f.Key)
			sb.Write(k)
			sb.WriteByte(':')
			sb.Write(f.Value)
		}
		sb.WriteByte('}')
		if err := json.Unmarshal([]byte(sb.String()), &parts); err != nil || !reflect.DeepEqual(whole, parts) {
			t.Fatalf("split %q into %s (%v)", b, sb.String(), err)
		}
	})
}
