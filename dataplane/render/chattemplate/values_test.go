package chattemplate

import (
	"strings"
	"testing"
)

func TestDecodeValue(t *testing.T) {
	for _, tc := range []struct {
		in, want string // want: the value re-encoded by tojson, or an error substring
		err      bool
	}{
		{`{"b": 1, "a": {"d": [], "c": {}}}`, `{"b": 1, "a": {"d": [], "c": {}}}`, false},
		{`{"a": 1, "b": 2, "a": 3}`, `{"a": 3, "b": 2}`, false},
		{`{"k1": 1, "k2": 2, "k3": 3, "k4": 4, "k5": 5, "k6": 6, "k7": 7, "k8": 8, "k9": {"x": 9, "x": 10}, "k10": 10, "k2": 0}`,
			`{"k1": 1, "k2": 0, "k3": 3, "k4": 4, "k5": 5, "k6": 6, "k7": 7, "k8": 8, "k9": {"x": 10}, "k10": 10}`, false}, // more members than fit on the stack
		{`[1, 1.0, 1e2, -0, 9223372036854775807, 9223372036854775808, 1e999]`, `[1, 1.0, 100.0, 0, 9223372036854775807, 9.223372036854776e+18, Infinity]`, false},
		{`"\u00e9\ud83c\udf89"`, `"é🎉"`, false},
		{" \t\n[ true ,false,null , \"a\\\"b\\\\\" ,\n{ \"k\\u0065y\" : [ ] } ] ", `[true, false, null, "a\"b\\", {"key": []}]`, false},
		{"[\"ok \xff\", \"\xe4\\n\"]", "[\"ok \uFFFD\", \"\uFFFD\\n\"]", false},
		{`[[[[[]]]]]`, `[[[[[]]]]]`, false},
		{`[[[[[[]]]]]]`, `nested deeper than 5 levels`, true},
		{`{"a": 1} {}`, `invalid JSON`, true},
		{`{"a" 1}`, `invalid JSON`, true},
		{``, `invalid JSON`, true},
	} {
		v, err := decodeValue([]byte(tc.in), 5, false, nil, nil)
		if tc.err {
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decodeValue(%s): err = %v, want %q", tc.in, err, tc.want)
			}
			continue
		}
		if err != nil {
			t.Errorf("decodeValue(%s): %v", tc.in, err)
			continue
		}
		var b strings.Builder
		if err := encodeJSON(&b, v, &jsonOptions{itemSep: ", ", keySep: ": "}, 0); err != nil || b.String() != tc.want {
			t.Errorf("decodeValue(%s) = %s (%v), want %s", tc.in, b.String(), err, tc.want)
		}
	}
}
