package request

import (
	"bytes"
	"encoding/json"

	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// tokenIDs is a prompt's token ids: shared, chunks a cache keeps (never modified), then own;
// and their JSON array, as the pieces it is made of (segs) or in one piece (json), made when
// first asked for. A later turn's ids are mostly its history's, held by the rendered-history
// cache: they go to every leg without being copied into the request.
type tokenIDs struct {
	shared [][]int32
	own    []int
	n      int
	segs   [][]byte
	json   json.RawMessage
}

// TokenCount is the number of the prompt's token ids.
func (rc *Context) TokenCount() int { return rc.tokens.n }

// TokenID is the prompt's i-th token id (0 <= i < TokenCount).
func (rc *Context) TokenID(i int) int {
	for _, ch := range rc.tokens.shared {
		if i < len(ch) {
			return int(ch[i])
		}
		i -= len(ch)
	}
	return rc.tokens.own[i]
}

// TokenIDs are the prompt's token ids in one slice, not to be modified (made once when they are
// held in chunks).
func (rc *Context) TokenIDs() []int {
	t := &rc.tokens
	if len(t.shared) > 0 {
		ids := make([]int, 0, t.n)
		for _, ch := range t.shared {
			for _, id := range ch {
				ids = append(ids, int(id))
			}
		}
		t.shared, t.own = nil, append(ids, t.own...)
	}
	return t.own
}

// TokenIDsJSON is the JSON array of the token ids in one piece, made once (joined, when it is
// held in pieces).
func (rc *Context) TokenIDsJSON() json.RawMessage {
	t := &rc.tokens
	switch {
	case t.json != nil:
	case t.segs != nil:
		t.json = bytes.Join(t.segs, nil)
	default:
		t.json = body.AppendInts(nil, rc.TokenIDs())
	}
	return t.json
}

// TokenIDsSegments is the JSON array of the token ids as the pieces it is made of, for
// body.Object.SetSegments: a leg sends a later turn's history as the cache holds it.
func (rc *Context) TokenIDsSegments() [][]byte {
	if rc.tokens.segs == nil {
		rc.tokens.segs = [][]byte{rc.TokenIDsJSON()} // made once: every leg asks
	}
	return rc.tokens.segs
}

// SetTokenIDs replaces the token ids (their JSON is made when first asked for).
func (rc *Context) SetTokenIDs(ids []int) { rc.tokens = tokenIDs{own: ids, n: len(ids)} }

// SetTokenIDsJSON replaces the token ids with ids, whose JSON array (body.AppendInts's) is js,
// made already (nil: made when first asked for).
func (rc *Context) SetTokenIDsJSON(ids []int, js json.RawMessage) {
	rc.tokens = tokenIDs{own: ids, n: len(ids), json: js}
}

// SetTokenChunks replaces the token ids with the chunks of shared followed by own, whose JSON
// array is the concatenation of segs (nil: made when first asked for). Nothing is copied: none of
// them may be modified afterwards.
func (rc *Context) SetTokenChunks(shared [][]int32, own []int, segs [][]byte) {
	n := len(own)
	for _, ch := range shared {
		n += len(ch)
	}
	rc.tokens = tokenIDs{shared: shared, own: own, n: n, segs: segs}
}
