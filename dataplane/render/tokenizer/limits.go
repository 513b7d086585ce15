package tokenizer

import (
	"context"
	"fmt"
)

// Limits bound one encoding: what a request may cost. The zero value bounds nothing.
type Limits struct {
	// Context stops the encoding when it is done (the client left); nil never does.
	Context context.Context
	// MaxTokens stops the encoding once it has produced more ids (0: no limit), Before of them
	// counted as made already (the ids the encoded text follows, kept elsewhere).
	MaxTokens, Before int
	// MaxWordBytes refuses a pre-token longer than this before it is merged (0: no limit). BPE
	// on one pre-token costs about 40 bytes of scratch per byte of it (a heap of candidate
	// pairs over a linked list of symbols), where text of ordinary words costs a few.
	MaxWordBytes int
}

// LimitError is an encoding stopped by its Limits' token or pre-token bound.
type LimitError struct {
	// Tokens is true for MaxTokens, false for MaxWordBytes.
	Tokens bool
	// Limit is the bound; Got what was seen when the encoding stopped (at least Limit+1: the ids
	// encoded so far, or the pre-token's length).
	Limit, Got int
}

// Error implements error.
func (e *LimitError) Error() string {
	if e.Tokens {
		return fmt.Sprintf("tokenizer: more than %d tokens", e.Limit)
	}
	return fmt.Sprintf("tokenizer: a pre-token of %d bytes is over the limit of %d", e.Got, e.Limit)
}

// checkEvery is how many bytes of text (in the pre-tokenizer's hot loop) or how many pre-tokens
// (elsewhere) pass between two checks of the limits: a check costs a context's Err, tens of
// nanoseconds, and 64 KiB of text encodes in about 100 µs.
const checkEvery = 64 << 10

// check records in st why the encoding must stop, if it must, and reports whether it must.
func (st *state) check(n int) bool {
	switch {
	case st.err != nil:
	case st.lim.MaxTokens > 0 && n+st.lim.Before > st.lim.MaxTokens:
		st.err = &LimitError{Tokens: true, Limit: st.lim.MaxTokens, Got: n + st.lim.Before}
	case st.lim.Context != nil:
		st.err = st.lim.Context.Err()
	}
	return st.err != nil
}

// checkWords is how many pre-tokens pass between two checks of the limits outside the hot loop.
const checkWords = 4096

// tick counts a pre-token and checks the limits every checkWords of them (n: the ids so far); it
// reports whether the encoding must stop.
func (st *state) tick(n int) bool {
	if st.err != nil {
		return true
	}
	if st.words++; st.words < checkWords {
		return false
	}
	st.words = 0
	return st.check(n)
}
