package tokenizer

import (
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync/atomic"
)

// wordCache is a bounded, lock-free cache of merged words (pre-tokens to their ids), shared by
// concurrent encoders.
//
// Words of up to 16 bytes that merge into at most 3 ids (nearly all of them) live inline in a
// 2-way set-associative table of 32-byte slots, a set per cache line: a look-up hashes the word's
// two little-endian 8-byte halves with one multiply and compares them, without a pointer or a
// string compare. Each slot is a seqlock: a writer marks it busy, stores, then bumps its version;
// a reader that sees it busy or changed takes it for a miss. Longer words, and words of more ids,
// go to a smaller table of immutable entries behind atomic pointers. A hash flood can only
// evict words (the tables are bounded, never chained).
type wordCache struct {
	short []wordSlot // 1<<wordSetBits sets of 2
	seed  uint64
	long  []atomic.Pointer[wordEntry]
	lseed maphash.Seed
}

// wordSlot is one inline entry:
//
//	meta: version<<32 | busy<<31 | nids<<29 | len<<24 | id2  (len 0: empty)
//	k0, k1: the word's bytes, zero-padded
//	ids: id1<<24 | id0
type wordSlot struct {
	meta, k0, k1, ids atomic.Uint64
}

type wordEntry struct {
	word string
	ids  []int32
}

const (
	wordSetBits  = 13 // 8192 sets of 2 slots: 512 KiB
	longSlots    = 1 << 12
	maxShortWord = 16
	maxShortIDs  = 3
	busy         = 1 << 31
	idMask       = 1<<24 - 1 // maxID
)

// maxCachedWord is the longest word the cache keeps: 256 bytes, a CJK sentence of 85 characters
// (a SentencePiece vocabulary's word runs from space to space, and CJK text has none). The long
// table holds at most longSlots such words and their ids: about 5.3 MiB (it was 64 bytes, and
// 1.4 MiB; a Llama 2 encode of mixed text takes 12% less).
const maxCachedWord = 256

func (c *wordCache) init() {
	c.short = make([]wordSlot, 2<<wordSetBits)
	c.lseed = maphash.MakeSeed()
	c.seed = rand.Uint64()
	c.long = make([]atomic.Pointer[wordEntry], longSlots)
}

// wordKeyTail returns the bytes s[i:j] (at most 16, near the end of s) as two little-endian
// words, zero-padded (Tokenizer.word computes the same where 16 bytes can be read).
func wordKeyTail(s string, i, j int) (k0, k1 uint64) {
	var b [16]byte
	copy(b[:], s[i:j])
	return le64(b[:8]), le64(b[8:])
}

// le64s and le64 read 8 bytes little-endian (the compiler makes each one load).
func le64s(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

func le64(b []byte) uint64 {
	_ = b[7]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// keyMask[n] keeps the first n bytes of a 16-byte key.
var keyMask = func() (m [maxShortWord + 1][2]uint64) {
	for n := range m {
		for k := range n {
			m[n][k/8] |= 0xFF << (8 * (k % 8))
		}
	}
	return m
}()

// set returns the word's set (a pair of slots: one cache line, the table being large enough for
// its allocation to be page-aligned).
func (c *wordCache) set(k0, k1 uint64, n int) *[2]wordSlot {
	h := (k0 ^ c.seed ^ bits.RotateLeft64(k1, 31) ^ uint64(n)) * 0x9E3779B97F4A7C15
	i := h >> (64 - wordSetBits) << 1
	return (*[2]wordSlot)(c.short[i : i+2])
}

// word appends the ids of the pre-token s[i:j]: from the word cache, else merged and cached.
func (t *Tokenizer) word(dst []int, s string, i, j int, st *state) []int {
	if st.tick(len(dst)) {
		return dst
	}
	n := j - i
	if n == 1 {
		return append(dst, int(t.merges.byteID[s[i]]))
	}
	if uint(n-2) > maxShortWord-2 {
		if n == 0 {
			return dst
		}
		return t.wordMiss(dst, s[i:j], 0, 0, st)
	}
	var k0, k1 uint64
	if i+16 <= len(s) {
		x := s[i : i+16]
		k0, k1 = le64s(x[:8])&keyMask[n][0], le64s(x[8:])&keyMask[n][1]
	} else {
		k0, k1 = wordKeyTail(s, i, j)
	}
	if m, x, ok := t.words.getShort(k0, k1, n); ok {
		return appendShort(dst, m, x)
	}
	return t.wordMiss(dst, s[i:j], k0, k1, st)
}

// wordMiss is word for a word the inline cache does not hold (k0, k1: its key when it is at most
// 16 bytes long).
func (t *Tokenizer) wordMiss(dst []int, w string, k0, k1 uint64, st *state) []int {
	n := len(w)
	if st.lim.MaxWordBytes > 0 && n > st.lim.MaxWordBytes { // cached or not: a request's answer does not depend on the cache
		st.err = &LimitError{Limit: st.lim.MaxWordBytes, Got: n}
		return dst
	}
	if n <= maxCachedWord {
		if ids, ok := t.words.getLong(w); ok {
			for _, id := range ids {
				dst = append(dst, int(id))
			}
			return dst
		}
	}
	if t.sp != nil && t.sp.digitsAlone && strings.ContainsAny(w, "0123456789") {
		return t.wordDigits(dst, w, st)
	}
	ids := t.merge(w, st)
	switch {
	case n <= maxShortWord && len(ids) <= maxShortIDs:
		t.words.putShort(k0, k1, n, ids)
	case n <= maxCachedWord:
		t.words.putLong(w, ids)
	}
	for _, id := range ids {
		dst = append(dst, int(id))
	}
	return dst
}

// wordDigits is wordMiss for a word w that holds an ASCII digit, of a SentencePiece vocabulary
// whose digits stand alone (digitsAlone): each digit is its own id, and the runs between them
// are words of their own, through the word cache. No merge joins across a digit (its result
// would be an entry holding it), so these are the whole word's ids; the whole word is not
// cached, its runs are. A number in a word (an id in a URL, a chapter in a CJK sentence, a
// function's suffix) no longer makes the word new to the cache and merged character by
// character.
func (t *Tokenizer) wordDigits(dst []int, w string, st *state) []int {
	for i := 0; i < len(w) && st.err == nil; {
		if c := w[i]; '0' <= c && c <= '9' {
			dst = append(dst, int(t.sp.ascii[c]))
			i++
			continue
		}
		j := i + 1
		for j < len(w) && (w[j] < '0' || w[j] > '9') {
			j++
		}
		switch {
		case j-i > 1: // whole characters: a digit is never inside one
			dst = t.word(dst, w, i, j, st)
		case t.sp.ascii[w[i]] >= 0:
			dst = append(dst, int(t.sp.ascii[w[i]]))
		default: // an ASCII character no entry spells: its byte's id
			k0, k1 := wordKeyTail(w, i, j)
			dst = t.wordMiss(dst, w[i:j], k0, k1, st)
		}
		i = j
	}
	return dst
}

// getShort returns the ids of a word of n <= 16 bytes (its key k0, k1) as a slot's meta and ids
// words. Both ways are compared and one is picked without a branch: which way holds a word is as
// good as random, so a branch on it would mispredict half the time. encodeFast has a copy
// inlined.
func (c *wordCache) getShort(k0, k1 uint64, n int) (meta, ids uint64, ok bool) {
	set := c.set(k0, k1, n)
	a, b := &set[0], &set[1]
	ma, mb := a.meta.Load(), b.meta.Load()
	want := uint64(n) << 24
	da := (ma&(busy|31<<24) ^ want) | (a.k0.Load() ^ k0) | (a.k1.Load() ^ k1)
	db := (mb&(busy|31<<24) ^ want) | (b.k0.Load() ^ k0) | (b.k1.Load() ^ k1)
	w := 0
	if db == 0 {
		w = 1
	}
	sel := -uint64(w)
	meta = ma&^sel | mb&sel
	ids = set[w].ids.Load()
	// A changed meta means that a writer got there: a miss.
	return meta, ids, min(da, db) == 0 && set[w].meta.Load() == meta
}

// appendShort appends the ids held by a slot's meta and ids words: all three, then the
// slice is cut to their number, without a branch on it.
func appendShort(dst []int, meta, ids uint64) []int {
	n := len(dst)
	dst = append(dst, int(ids&idMask), int(ids>>24&idMask), int(meta&idMask))
	return dst[:n+int(meta>>29&3)]
}

// putShort stores the ids (1 to 3) of a word of n <= 16 bytes; it gives up if a concurrent
// writer holds the slot.
func (c *wordCache) putShort(k0, k1 uint64, n int, ids []int32) {
	set := c.set(k0, k1, n)
	holds := func(w int) bool {
		return set[w].meta.Load()>>24&31 == uint64(n) && set[w].k0.Load() == k0 && set[w].k1.Load() == k1
	}
	w := 0
	switch {
	case holds(0): // a concurrent encoder's copy (or, in tests, other ids)
	case holds(1):
		w = 1
	case set[0].meta.Load()>>24&31 == 0:
	case set[1].meta.Load()>>24&31 == 0:
		w = 1
	default:
		w = bits.OnesCount64(k0^k1) & 1 // both ways taken: replace one at random
	}
	s := &set[w]
	m := s.meta.Load()
	if m&busy != 0 || !s.meta.CompareAndSwap(m, m|busy) {
		return
	}
	var x, id2 uint64
	for k, id := range ids {
		if k < 2 {
			x |= uint64(id) << (24 * k)
		} else {
			id2 = uint64(id)
		}
	}
	s.k0.Store(k0)
	s.k1.Store(k1)
	s.ids.Store(x)
	s.meta.Store((m>>32+1)<<32 | uint64(len(ids))<<29 | uint64(n)<<24 | id2)
}

func (c *wordCache) getLong(w string) ([]int32, bool) {
	i := maphash.String(c.lseed, w) & (longSlots - 2)
	if e := c.long[i].Load(); e != nil && e.word == w {
		return e.ids, true
	}
	if e := c.long[i+1].Load(); e != nil && e.word == w {
		return e.ids, true
	}
	return nil, false
}

func (c *wordCache) putLong(w string, ids []int32) {
	h := maphash.String(c.lseed, w)
	i := h & (longSlots - 2)
	switch {
	case c.long[i].Load() == nil:
	case c.long[i+1].Load() == nil:
		i++
	default:
		i += (h >> 32) & 1 // both ways taken: replace one at random
	}
	c.long[i].Store(&wordEntry{word: string([]byte(w)), ids: append([]int32(nil), ids...)})
}
