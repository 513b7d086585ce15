package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"math/bits"
	"strings"
)

// maxID bounds ids so that the tables below stay compact.
const maxID = 1 << 24

// vocabIndex maps the bytes of a token (byte-level alphabet decoded) to its id: one string arena,
// a per-id (offset, length) table and an open-addressing hash index, instead of a map with a
// separately allocated string per entry.
type vocabIndex struct {
	arena string
	byID  []vocabEnt // indexed by id; n == absent for ids no entry has
	table []uint32   // id+1, 0 = empty
	mask  uint64
	seed  maphash.Seed
	other map[string]int // entries outside the byte-level alphabet: TokenID only, BPE cannot produce them
}

type vocabEnt struct{ off, n uint32 }

const absent = ^uint32(0)

// build indexes the vocabulary, then the added tokens over it (an added token's content wins).
// Entries are stored by the bytes a spells them with.
func (v *vocabIndex) build(vocab map[string]int, added map[string]int, a alphabet) error {
	v.seed = maphash.MakeSeed()
	v.other = map[string]int{}
	top := -1
	for tok, id := range vocab {
		if id < 0 || id >= maxID {
			return errAt("model.vocab", "id %d of %q is out of range [0, %d)", id, tok, maxID)
		}
		top = max(top, id)
	}
	for tok, id := range added {
		if id >= maxID {
			return errAt("added_tokens", "id %d of %q is out of range [0, %d)", id, tok, maxID)
		}
		top = max(top, id)
	}
	v.byID = make([]vocabEnt, top+1)
	for i := range v.byID {
		v.byID[i].n = absent
	}
	size := 0
	for tok := range vocab {
		size += len(tok)
	}
	arena := make([]byte, 0, size)
	for tok, id := range vocab {
		raw, ok := a.decode(tok)
		if !ok {
			v.other[tok] = id
			continue
		}
		if e := v.byID[id]; e.n != absent {
			return errAt("model.vocab", "%q and %q share id %d", tok, a.encode(string(arena[e.off:e.off+e.n])), id)
		}
		v.byID[id] = vocabEnt{off: uint32(len(arena)), n: uint32(len(raw))}
		arena = append(arena, raw...)
	}
	byRaw := make(map[string]int, len(added))
	for tok, id := range added {
		if raw, ok := a.decode(tok); ok {
			byRaw[raw] = id
		}
	}
	for raw, id := range byRaw {
		if e := v.byID[id]; e.n == absent {
			v.byID[id] = vocabEnt{off: uint32(len(arena)), n: uint32(len(raw))}
			arena = append(arena, raw...)
		} else if string(arena[e.off:e.off+e.n]) != raw {
			return errAt("added_tokens", "%q and vocabulary entry %q share id %d", a.encode(raw), a.encode(string(arena[e.off:e.off+e.n])), id)
		}
	}
	v.arena = string(arena)
	n := 0
	for _, e := range v.byID {
		if e.n != absent {
			n++
		}
	}
	v.table = make([]uint32, nextPow2(n+n/2+1))
	v.mask = uint64(len(v.table) - 1)
	for id, e := range v.byID {
		if e.n == absent {
			continue
		}
		raw := v.arena[e.off : e.off+e.n]
		if aid, ok := byRaw[raw]; ok && aid != id {
			continue // an added token of the same content takes this key
		}
		v.insert(raw, id)
	}
	return nil
}

// toByteLevel spells raw bytes in the byte-level alphabet, as tokenizer.json does.
func toByteLevel(raw string) string {
	out := make([]rune, len(raw))
	for i := 0; i < len(raw); i++ {
		out[i] = byteToRune[raw[i]]
	}
	return string(out)
}

func (v *vocabIndex) insert(raw string, id int) {
	for h := maphash.String(v.seed, raw) & v.mask; ; h = (h + 1) & v.mask {
		if v.table[h] == 0 {
			v.table[h] = uint32(id + 1)
			return
		}
	}
}

// lookup returns the id of the token whose bytes are raw.
func (v *vocabIndex) lookup(raw string) (int, bool) {
	for h := maphash.String(v.seed, raw) & v.mask; ; h = (h + 1) & v.mask {
		slot := v.table[h]
		if slot == 0 {
			return 0, false
		}
		e := v.byID[slot-1]
		if int(e.n) == len(raw) && v.arena[e.off:e.off+e.n] == raw {
			return int(slot - 1), true
		}
	}
}

func nextPow2(n int) int { return 1 << bits.Len(uint(n-1)) }

// mergeTable maps a pair of ids to its merge rank and merged id: open addressing on the packed
// key left<<32|right (Fibonacci hashing, linear probing).
type mergeTable struct {
	slots  []mergeSlot
	shift  uint
	byteID [256]int32 // the id of each single byte
	// digitMerged: some merge of a literal vocabulary makes an entry that holds an ASCII digit
	// (sentencePiece's digitsAlone).
	digitMerged bool
}

type mergeSlot struct {
	key  uint64
	rank uint32
	id   int32
}

const (
	emptyKey = ^uint64(0)
	noRank   = ^uint32(0)
)

func (m *mergeTable) build(merges [][]byte, v *vocabIndex, alpha alphabet) error {
	size := nextPow2(len(merges) + len(merges)/2 + 1)
	m.slots = make([]mergeSlot, size)
	for i := range m.slots {
		m.slots[i].key = emptyKey
	}
	m.shift = uint(64 - bits.Len(uint(size-1)))
	if size == 1 {
		m.shift = 63
	}
	for i, raw := range merges {
		a, b, err := parseMerge(raw)
		if err != nil {
			return errAt(fmt.Sprintf("model.merges[%d]", i), "%v", err)
		}
		var ids [3]int
		for k, tok := range [3]string{a, b, a + b} {
			rb, ok := alpha.decode(tok)
			id, found := v.lookup(rb)
			if !ok || !found {
				return errAt(fmt.Sprintf("model.merges[%d]", i), "%q is not in the vocabulary", tok)
			}
			ids[k] = id
		}
		m.digitMerged = m.digitMerged || alpha == literalAlphabet && (strings.ContainsAny(a, "0123456789") || strings.ContainsAny(b, "0123456789"))
		m.put(pairKey(int32(ids[0]), int32(ids[1])), uint32(i), int32(ids[2])) // a later duplicate wins, as in both references
	}
	return nil
}

// parseMerge reads "a b" or ["a", "b"], with fast paths for strings without escapes.
func parseMerge(raw []byte) (string, string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 4 && raw[0] == '[' && raw[len(raw)-1] == ']' && bytes.IndexByte(raw, '\\') < 0 {
		inner := bytes.TrimSpace(raw[1 : len(raw)-1])
		a, b, ok := bytes.Cut(inner, []byte{','})
		a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
		if ok && len(a) > 2 && len(b) > 2 && a[0] == '"' && a[len(a)-1] == '"' && b[0] == '"' && b[len(b)-1] == '"' &&
			bytes.IndexByte(a[1:len(a)-1], '"') < 0 && bytes.IndexByte(b[1:len(b)-1], '"') < 0 {
			return string(a[1 : len(a)-1]), string(b[1 : len(b)-1]), nil
		}
	}
	if s, err := jsonString(raw); err == nil {
		a, b, ok := strings.Cut(s, " ")
		if !ok || a == "" || b == "" || strings.IndexByte(b, ' ') >= 0 {
			return "", "", fmt.Errorf("want \"a b\", got %s", raw)
		}
		return a, b, nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 || pair[0] == "" || pair[1] == "" {
		return "", "", fmt.Errorf("want \"a b\" or [\"a\", \"b\"], got %s", raw)
	}
	return pair[0], pair[1], nil
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

func (m *mergeTable) put(key uint64, rank uint32, id int32) {
	mask := uint64(len(m.slots) - 1)
	for h := (key * 0x9E3779B97F4A7C15) >> m.shift; ; h = (h + 1) & mask {
		s := &m.slots[h]
		if s.key == emptyKey || s.key == key {
			*s = mergeSlot{key: key, rank: rank, id: id}
			return
		}
	}
}

// get returns the rank and merged id of the pair (a, b), or noRank.
func (m *mergeTable) get(a, b int32) (uint32, int32) {
	key := pairKey(a, b)
	mask := uint64(len(m.slots) - 1)
	for h := (key * 0x9E3779B97F4A7C15) >> m.shift; ; h = (h + 1) & mask {
		s := &m.slots[h]
		if s.key == key {
			return s.rank, s.id
		}
		if s.key == emptyKey {
			return noRank, -1
		}
	}
}

// smallWord is the longest word merged by the quadratic scan; longer ones use a heap.
// Both pick the lowest rank, leftmost first, as the reference's priority queue does.
const smallWord = 48

// merge returns the ids of the word w (at least 2 bytes), in the state's scratch space.
func (t *Tokenizer) merge(w string, st *state) []int32 {
	if t.sp != nil {
		return t.sp.merge(t, w, st)
	}
	if t.ignoreMrg {
		if id, ok := t.vocab.lookup(w); ok {
			st.ids = append(st.ids[:0], int32(id))
			return st.ids
		}
	}
	if len(w) <= smallWord {
		return t.mergeSmall(w, st)
	}
	return t.mergeHeap(w, st)
}

// mergeSmall merges by scanning all pairs for the lowest rank each round: O(n²), fastest for
// the short words that make up nearly all text.
func (t *Tokenizer) mergeSmall(w string, st *state) []int32 {
	ids := st.ids[:0]
	for i := 0; i < len(w); i++ {
		ids = append(ids, t.merges.byteID[w[i]])
	}
	return t.mergeSmallIDs(ids, st)
}

// mergeSmallIDs merges the symbols ids (st.ids's storage) in place.
func (t *Tokenizer) mergeSmallIDs(ids []int32, st *state) []int32 {
	m := &t.merges
	ranks, mer := st.ranks[:0], st.mer[:0]
	for i := 0; i+1 < len(ids); i++ {
		r, id := m.get(ids[i], ids[i+1])
		ranks, mer = append(ranks, r), append(mer, id)
	}
	for {
		best, bi := noRank, -1
		for i, r := range ranks {
			if r < best {
				best, bi = r, i
			}
		}
		if bi < 0 {
			break
		}
		ids[bi] = mer[bi]
		ids = append(ids[:bi+1], ids[bi+2:]...)
		ranks = append(ranks[:bi], ranks[bi+1:]...)
		mer = append(mer[:bi], mer[bi+1:]...)
		if bi > 0 {
			ranks[bi-1], mer[bi-1] = m.get(ids[bi-1], ids[bi])
		}
		if bi < len(ids)-1 {
			ranks[bi], mer[bi] = m.get(ids[bi], ids[bi+1])
		}
	}
	st.ids, st.ranks, st.mer = ids, ranks, mer
	return ids
}

// mergeHeap merges with a min-heap of (rank, position) over a linked list of symbols:
// O(n log n), for long words such as runs of 100k spaces.
func (t *Tokenizer) mergeHeap(w string, st *state) []int32 {
	sym := grow(st.sym, len(w))
	for i := 0; i < len(w); i++ {
		sym[i] = t.merges.byteID[w[i]]
	}
	return t.mergeHeapIDs(sym, st)
}

// mergeHeapIDs merges the symbols sym (st.sym's storage, at least 2) into st.ids.
func (t *Tokenizer) mergeHeapIDs(sym []int32, st *state) []int32 {
	m := &t.merges
	n := len(sym)
	next, prev := grow(st.next, n), grow(st.prev, n)
	for i := 0; i < n; i++ {
		next[i], prev[i] = int32(i+1), int32(i-1)
	}
	next[n-1] = -1
	h := st.heap[:0]
	for i := 0; i+1 < n; i++ {
		if r, _ := m.get(sym[i], sym[i+1]); r != noRank {
			h = heapPush(h, uint64(r)<<32|uint64(i))
		}
	}
	for len(h) > 0 {
		var top uint64
		top, h = heapPop(h)
		r, pos := uint32(top>>32), int32(uint32(top))
		nx := next[pos]
		if sym[pos] < 0 || nx < 0 {
			continue
		}
		rr, id := m.get(sym[pos], sym[nx])
		if rr != r {
			continue // stale: a neighbour merged since this pair was queued
		}
		sym[pos], sym[nx] = id, -1
		nn := next[nx]
		next[pos] = nn
		if nn >= 0 {
			prev[nn] = pos
			if r2, _ := m.get(id, sym[nn]); r2 != noRank {
				h = heapPush(h, uint64(r2)<<32|uint64(pos))
			}
		}
		if p := prev[pos]; p >= 0 {
			if r2, _ := m.get(sym[p], id); r2 != noRank {
				h = heapPush(h, uint64(r2)<<32|uint64(p))
			}
		}
	}
	out := st.ids[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, sym[i])
	}
	st.sym, st.next, st.prev, st.heap, st.ids = sym, next, prev, h, out
	return out
}

func grow(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

func heapPush(h []uint64, x uint64) []uint64 {
	h = append(h, x)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if h[p] <= h[i] {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func heapPop(h []uint64) (uint64, []uint64) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		c := l
		if r := l + 1; r < len(h) && h[r] < h[l] {
			c = r
		}
		if h[i] <= h[c] {
			break
		}
		h[i], h[c] = h[c], h[i]
		i = c
	}
	return top, h
}
