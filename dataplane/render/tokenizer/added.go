package tokenizer

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// addedTokens splits text on added tokens as the reference does (Tokenizer.encode_text): a trie
// matches, at each position from the left, the longest token; tokens with normalized: false (or
// all, without a normalizer) are matched in the raw text, the others in each normalized section.
// lstrip/rstrip trim the neighbouring sections' ECMAScript whitespace.
type addedTokens struct {
	byContent map[string]int       // content -> id (TokenID)
	byKey     map[string]addedInfo // content and normalized content -> token (the reference's added_tokens_map)
	maxKey    int                  // longest key in bytes
	keyFirst  [256]bool            // the first bytes of the keys
	strips    bool                 // some token has lstrip or rstrip
	raw, norm trie
}

type addedInfo struct {
	id             int
	lstrip, rstrip bool
}

func (a *addedTokens) build(tokens []rawAddedToken, normSteps []normStep) error {
	a.byContent = make(map[string]int, len(tokens))
	a.byKey = make(map[string]addedInfo, len(tokens))
	var raw, normed []string
	st := new(state)
	for i, tk := range tokens {
		if tk.SingleWord {
			// The reference ignores single_word while the Rust library enforces word boundaries.
			return errAt(fmt.Sprintf("added_tokens[%d].single_word", i), "true is not supported")
		}
		info := addedInfo{id: *tk.ID, lstrip: tk.LStrip, rstrip: tk.RStrip}
		a.strips = a.strips || tk.LStrip || tk.RStrip
		a.byContent[tk.Content] = info.id
		a.setKey(tk.Content, info)
		normalized := !tk.Special
		if tk.Normalized != nil {
			normalized = *tk.Normalized
		}
		if normalized && len(normSteps) > 0 {
			n := strings.Clone(runNorm(normSteps, st, tk.Content))
			a.setKey(n, info)
			normed = append(normed, n)
		} else {
			raw = append(raw, tk.Content)
		}
	}
	a.raw.build(raw, a.byKey)
	a.norm.build(normed, a.byKey)
	return nil
}

func (a *addedTokens) setKey(k string, info addedInfo) {
	a.byKey[k] = info
	a.maxKey = max(a.maxKey, len(k))
	if k != "" {
		a.keyFirst[k[0]] = true
	}
}

// key returns the token whose content or normalized content is s.
func (a *addedTokens) key(s string) (addedInfo, bool) {
	if len(s) > a.maxKey || s == "" || !a.keyFirst[s[0]] {
		return addedInfo{}, false
	}
	info, ok := a.byKey[s]
	return info, ok
}

// sections appends the pieces of s between and including the matches of tr to dst, and to ids
// the token each is (-1: text), then applies lstrip/rstrip. Pieces are visited in order and a
// token's neighbours are trimmed in place, so a piece is looked up as it stands when visited,
// as in the reference; a token trimmed by a neighbour is text to be looked up again.
func (a *addedTokens) sections(dst []span, ids []int32, s string, tr *trie) ([]span, []int32) {
	n0 := len(dst)
	dst, ids = tr.split(dst, ids, s)
	if !a.strips {
		return dst, ids
	}
	secs, secIDs := dst[n0:], ids[n0:]
	for i := range secs {
		info, ok := a.key(s[secs[i].start:secs[i].end])
		if !ok {
			continue
		}
		if info.lstrip && i > 0 {
			p := &secs[i-1]
			if end := p.start + len(strings.TrimRightFunc(s[p.start:p.end], isJSSpace)); end != p.end {
				p.end, secIDs[i-1] = end, -1
			}
		}
		if info.rstrip && i < len(secs)-1 {
			q := &secs[i+1]
			if start := q.end - len(strings.TrimLeftFunc(s[q.start:q.end], isJSSpace)); start != q.start {
				q.start, secIDs[i+1] = start, -1
			}
		}
	}
	return dst, ids
}

// trie is a byte trie of token contents.
type trie struct {
	nodes []trieNode
	first [256]bool
	only  int // the first byte of every token when they share it (typically '<'), else -1
}

type trieNode struct {
	edges []trieEdge // sorted by byte
	end   bool       // a token ends here
	id    int32      // then the token it is: the added_tokens_map's entry for its content
}

type trieEdge struct {
	b     byte
	child int32
}

func (t *trie) build(words []string, byKey map[string]addedInfo) {
	t.nodes = []trieNode{{}}
	for _, w := range words {
		if w == "" {
			continue // the reference never matches an empty token
		}
		t.first[w[0]] = true
		n := 0
		for i := 0; i < len(w); i++ {
			c := t.child(n, w[i])
			if c < 0 {
				c = len(t.nodes)
				t.nodes = append(t.nodes, trieNode{})
				e := &t.nodes[n].edges
				*e = append(*e, trieEdge{w[i], int32(c)})
				sort.Slice(*e, func(a, b int) bool { return (*e)[a].b < (*e)[b].b })
			}
			n = c
		}
		t.nodes[n].end, t.nodes[n].id = true, int32(byKey[w].id)
	}
	t.only = -1
	for b, ok := range t.first {
		switch {
		case !ok:
		case t.only == -1:
			t.only = b
		default:
			t.only = -2
		}
	}
	t.only = max(t.only, -1)
}

func (t *trie) child(n int, b byte) int {
	for _, e := range t.nodes[n].edges {
		if e.b == b {
			return int(e.child)
		}
		if e.b > b {
			break
		}
	}
	return -1
}

// longest returns the end of the longest token starting at s[i] and its id, or -1.
func (t *trie) longest(s string, i int) (end int, id int32) {
	end = -1
	for n, j := 0, i; j < len(s); j++ {
		if n = t.child(n, s[j]); n < 0 {
			break
		}
		if t.nodes[n].end {
			end, id = j+1, t.nodes[n].id
		}
	}
	return end, id
}

// split appends the text pieces and token matches of s to dst, and to ids -1 or the token
// matched, scanning left to right and taking the longest token at each position.
func (t *trie) split(dst []span, ids []int32, s string) ([]span, []int32) {
	if len(t.nodes) <= 1 {
		return append(dst, span{0, len(s)}), append(ids, -1)
	}
	start := 0
	for i := 0; i < len(s); {
		if t.only >= 0 {
			k := strings.IndexByte(s[i:], byte(t.only))
			if k < 0 {
				break
			}
			i += k
		} else if i = t.next(s, i); i == len(s) {
			break
		}
		end, id := t.longest(s, i)
		if end < 0 {
			i++
			continue
		}
		if i > start {
			dst, ids = append(dst, span{start, i}), append(ids, -1)
		}
		dst, ids = append(dst, span{i, end}), append(ids, id)
		i, start = end, end
	}
	if start < len(s) {
		dst, ids = append(dst, span{start, len(s)}), append(ids, -1)
	}
	return dst, ids
}

// next returns the first position from i where a token may start, or len(s): eight bytes a
// step, one branch for the eight.
func (t *trie) next(s string, i int) int {
	f := &t.first
	for ; i+8 <= len(s); i += 8 {
		x := s[i : i+8]
		if f[x[0]] || f[x[1]] || f[x[2]] || f[x[3]] || f[x[4]] || f[x[5]] || f[x[6]] || f[x[7]] {
			break
		}
	}
	for ; i < len(s) && !f[s[i]]; i++ {
	}
	return i
}

// sanitize replaces each invalid byte of s with U+FFFD, as decoding a JSON string does.
func sanitize(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}
