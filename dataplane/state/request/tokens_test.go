package request

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
)

// TestTokenIDs: the prompt's ids, set in one slice or as shared chunks followed by own ids,
// read the same (count, each id, the slice, the JSON in one piece and in pieces); chunks are not
// copied until the ids are asked for in one slice.
func TestTokenIDs(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(rc *Context)
		want []int
		segs int // pieces of the JSON
	}{
		{"one slice", func(rc *Context) { rc.SetTokenIDs([]int{1, -2, 30}) }, []int{1, -2, 30}, 1},
		{"none", func(rc *Context) { rc.SetTokenIDs(nil) }, nil, 1},
		{"with its JSON", func(rc *Context) { rc.SetTokenIDsJSON([]int{7, 8}, []byte("[7,8]")) }, []int{7, 8}, 1},
		{"chunks then own", func(rc *Context) {
			rc.SetTokenChunks([][]int32{{1, 2}, {3}}, []int{4, 5}, [][]byte{[]byte("["), []byte("1,2"), []byte(","), []byte("3"), []byte(",4,5]")})
		}, []int{1, 2, 3, 4, 5}, 5},
		{"chunks only", func(rc *Context) {
			rc.SetTokenChunks([][]int32{{9}}, nil, [][]byte{[]byte("["), []byte("9"), []byte("]")})
		}, []int{9}, 3},
		{"chunks, JSON made when asked", func(rc *Context) { rc.SetTokenChunks([][]int32{{6}, {}, {7}}, []int{8}, nil) }, []int{6, 7, 8}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := &Context{}
			tc.set(rc)
			if rc.TokenCount() != len(tc.want) {
				t.Fatalf("TokenCount = %d, want %d", rc.TokenCount(), len(tc.want))
			}
			for i, id := range tc.want {
				if got := rc.TokenID(i); got != id {
					t.Fatalf("TokenID(%d) = %d, want %d", i, got, id)
				}
			}
			wantJSON, _ := json.Marshal(tc.want)
			if tc.want == nil {
				wantJSON = []byte("[]")
			}
			segs := rc.TokenIDsSegments()
			if len(segs) != tc.segs || string(bytes.Join(segs, nil)) != string(wantJSON) {
				t.Fatalf("TokenIDsSegments = %q, want %d pieces of %s", segs, tc.segs, wantJSON)
			}
			if got := string(rc.TokenIDsJSON()); got != string(wantJSON) {
				t.Fatalf("TokenIDsJSON = %s, want %s", got, wantJSON)
			}
			if got := rc.TokenIDs(); !slices.Equal(got, tc.want) {
				t.Fatalf("TokenIDs = %v, want %v", got, tc.want)
			}
			if rc.TokenCount() != len(tc.want) || len(rc.TokenIDsSegments()) != tc.segs || (len(tc.want) > 0 && rc.TokenID(len(tc.want)-1) != tc.want[len(tc.want)-1]) {
				t.Fatalf("after TokenIDs: %d ids, %d pieces", rc.TokenCount(), len(rc.TokenIDsSegments()))
			}
		})
	}
}
