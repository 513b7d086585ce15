package wire

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/body"
)

func TestTokenIDs(t *testing.T) {
	for _, tc := range []struct {
		in        string
		want      []int
		canonical bool // as body.AppendInts writes want
		err       string
	}{
		{in: `[]`, want: []int{}, canonical: true},
		{in: `[0,1,151643,2147483647]`, want: []int{0, 1, 151643, 2147483647}, canonical: true},
		{in: ` [ 0 , 1,2147483647 ] `, want: []int{0, 1, 2147483647}},
		{in: "[\n3\t,\r4]", want: []int{3, 4}},
		{in: `[3,4] `, want: []int{3, 4}},
		{in: `[ ]`, want: []int{}},
		{in: `[1e3]`, err: "item 0 is 1e3"},
		{in: `[1.0]`, err: "item 0 is 1.0"},
		{in: `[5, -1]`, err: "item 1 is -1"},
		{in: `[01]`, err: "item 0 is 01"},
		{in: `[2147483648]`, err: "item 0 is 2147483648"},
		{in: `[99999999999999999999999]`, err: "item 0 is 99999999999999999999"},
		{in: `["1"]`, err: `item 0 is "1"`},
		{in: `[null]`, err: "item 0 is null"},
		{in: `[1,]`, err: "item 1 is "},
		{in: `[1 2]`, err: "must be an array"},
		{in: `{"a": 1}`, err: "must be an array"},
		{in: `[1`, err: "must be an array"},
	} {
		got, canonical, err := ParseTokenIDs(json.RawMessage(tc.in), maxTokenID)
		switch {
		case tc.err == "" && (err != nil || !slices.Equal(got, tc.want)):
			t.Errorf("TokenIDs(%s) = %v, %v; want %v", tc.in, got, err, tc.want)
		case tc.err == "" && canonical != tc.canonical:
			t.Errorf("ParseTokenIDs(%s): canonical %v, want %v", tc.in, canonical, tc.canonical)
		case canonical && tc.in != string(body.AppendInts(nil, got)):
			t.Errorf("ParseTokenIDs(%s) is canonical, but the ids are written %s", tc.in, body.AppendInts(nil, got))
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("TokenIDs(%s): err %v, want it to contain %q", tc.in, err, tc.err)
		}
	}
}
