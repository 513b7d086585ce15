// Package render tokenizes requests in process: a model directory's Hugging Face tokenizer
// (dataplane/render/tokenizer) and chat template (dataplane/render/chattemplate), with the conversion vLLM
// applies to OpenAI chat messages before it renders them. A directory is loaded once and shared,
// across pipelines and reloads, for as long as its files are unchanged; encoded text between
// special tokens (each message of a conversation, which multi-turn clients send again with every
// turn) is cached by content.
package render

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/epd-dev/coordinator/dataplane/render/chattemplate"
	"github.com/epd-dev/coordinator/dataplane/render/jinja"
	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// Options select what Open loads.
type Options struct {
	// ChatTemplate names one of the directory's named chat templates ("" : the default one).
	ChatTemplate string
	// CacheBytes bounds the cache of encoded segments (0: no cache). With the rendered-history
	// cache, it keeps a segment encoded a second time (tokenizer.SegmentCache.AdmitOnSecondSight).
	CacheBytes int64
	// HistoryBytes bounds the rendered-history cache (0: no cache): the rendered text and ids of
	// the conversations rendered lately, which their next turn reuses (history.go), in one half;
	// what the template's iterations over their messages did (chattemplate.IterationCache), which
	// their next turn replays, in a quarter; their messages decoded into the template's values
	// (chattemplate.MessageCache) and their long message strings decoded
	// (chattemplate.StringCache), an eighth each.
	HistoryBytes int64
}

// minCachedSegment is the shortest segment worth caching: a shorter one encodes in about as long
// as its lookup takes.
const minCachedSegment = 256

// Model is a model directory's tokenizer and chat template. It is safe for concurrent use.
type Model struct {
	dir           string
	key           string
	tok           *tokenizer.Tokenizer
	tmpl          *chattemplate.Template
	cache         *tokenizer.SegmentCache
	history       *historyCache
	strings       *chattemplate.StringCache    // with history: the decoded strings of its conversations
	messages      *chattemplate.MessageCache   // with history: their decoded messages
	iterations    *chattemplate.IterationCache // with history: their template's iterations
	contentFormat string
	refs          int // guarded by loaded.mu
}

// loaded holds the models open now, by fingerprint.
var loaded = struct {
	mu sync.Mutex
	m  map[string]*Model
}{m: map[string]*Model{}}

// files are what the tokenizer and chat template loaders read from a model directory.
var files = []string{"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json", "special_tokens_map.json"}

// Open loads dir's tokenizer and chat template, or shares the model already open with the same
// files and options. Close it when done. Errors name the file at fault.
func Open(dir string, o Options) (*Model, error) {
	key, err := fingerprint(dir, o)
	if err != nil {
		return nil, err
	}
	loaded.mu.Lock()
	defer loaded.mu.Unlock()
	if m := loaded.m[key]; m != nil {
		m.refs++
		return m, nil
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, err
	}
	tmpl, err := chattemplate.Load(dir, o.ChatTemplate)
	if err != nil {
		return nil, err
	}
	m := &Model{dir: dir, key: key, tok: tok, tmpl: tmpl, contentFormat: tmpl.ContentFormat(), refs: 1}
	if o.CacheBytes > 0 {
		m.cache = tokenizer.NewSegmentCache(o.CacheBytes, minCachedSegment)
	}
	if o.HistoryBytes > 0 {
		if m.cache != nil { // a conversation's own messages are found in m.history by its next turn
			m.cache.AdmitOnSecondSight()
		}
		m.history = newHistoryCache(o.HistoryBytes - o.HistoryBytes/2)
		m.iterations = chattemplate.NewIterationCache(o.HistoryBytes / 4)
		m.strings = chattemplate.NewStringCache(o.HistoryBytes / 8)
		m.messages = chattemplate.NewMessageCache(o.HistoryBytes/2 - o.HistoryBytes/4 - o.HistoryBytes/8)
	}
	loaded.m[key] = m
	return m, nil
}

// Close releases the model; the last Close of a model unloads it.
func (m *Model) Close() {
	loaded.mu.Lock()
	defer loaded.mu.Unlock()
	if m.refs--; m.refs == 0 {
		delete(loaded.m, m.key)
	}
}

// VocabSize is the number of token ids the tokenizer knows (its largest id plus one).
func (m *Model) VocabSize() int { return m.tok.VocabSize() }

// Dir is the directory the model was loaded from.
func (m *Model) Dir() string { return m.dir }

// CacheStats reports the segment cache (zero without one).
func (m *Model) CacheStats() (hits, misses uint64, bytes int64) {
	if m.cache == nil {
		return 0, 0, 0
	}
	return m.cache.Stats()
}

// HistoryStats reports the rendered-history cache (zero without one): the renders that reused a
// cached conversation's ids (hits) and those that did not (misses), the tokens reused, and the
// bytes held (its decoded messages and strings included).
func (m *Model) HistoryStats() (hits, misses, tokens uint64, bytes int64) {
	if m.history == nil {
		return 0, 0, 0, 0
	}
	hits, misses, tokens, bytes = m.history.stats()
	_, _, sb := m.strings.Stats()
	_, _, mb := m.messages.Stats()
	_, _, ib := m.iterations.Stats()
	return hits, misses, tokens, bytes + sb + mb + ib
}

// IterationStats reports the rendered-history cache's template iterations (zero without one):
// those replayed and those run.
func (m *Model) IterationStats() (replayed, ran uint64) {
	if m.history == nil {
		return 0, 0
	}
	replayed, ran, _ = m.iterations.Stats()
	return replayed, ran
}

// DecodedStats reports the rendered-history cache's decoded inputs (zero without one): the
// messages found decoded into the template's values and those decoded, and the same for long
// message strings.
func (m *Model) DecodedStats() (msgHits, msgMisses, strHits, strMisses uint64) {
	if m.history == nil {
		return 0, 0, 0, 0
	}
	msgHits, msgMisses, _ = m.messages.Stats()
	strHits, strMisses, _ = m.strings.Stats()
	return msgHits, msgMisses, strHits, strMisses
}

// fingerprint identifies dir's files (each by its name, length and content) and o.
func fingerprint(dir string, o Options) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%q %d %d\n", o.ChatTemplate, o.CacheBytes, o.HistoryBytes)
	paths := make([]string, 0, len(files)+4)
	for _, name := range files {
		paths = append(paths, filepath.Join(dir, name))
	}
	extra, _ := filepath.Glob(filepath.Join(dir, "additional_chat_templates", "*.jinja"))
	for _, path := range append(paths, extra...) {
		name, _ := filepath.Rel(dir, path)
		f, err := os.Open(path)
		if errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(h, "%s absent\n", name)
			continue
		}
		if err != nil {
			return "", fmt.Errorf("localrender: %w", err)
		}
		fi, err := f.Stat()
		if err == nil {
			fmt.Fprintf(h, "%s %d\n", name, fi.Size())
			_, err = io.Copy(h, f)
		}
		f.Close()
		if err != nil {
			return "", fmt.Errorf("localrender: reading %s: %w", path, err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Limits bound one render: what one request may cost. The zero value bounds nothing.
type Limits struct {
	// MaxInputBytes bounds the text encoded (a prompt, or the conversation as its template
	// renders it) and the template's input (messages, tools and kwargs as JSON).
	MaxInputBytes int
	// MaxValues bounds the JSON values of the template's input.
	MaxValues int
	// Encode bounds the encoding: the client's context, the tokens, the longest pre-token.
	Encode tokenizer.Limits
}

// LimitError is a render past one of its Limits.
type LimitError struct {
	// Limit names the Limits field: "MaxInputBytes", "MaxValues", "MaxTokens" or
	// "MaxWordBytes" (the template's own MaxMessages and MaxDepth too).
	Limit   string
	Message string
}

// Error implements error.
func (e *LimitError) Error() string { return "render: " + e.Message }

// encode encodes text under l.
func (m *Model) encode(dst []int, text string, addSpecial bool, l Limits) ([]int, error) {
	if l.MaxInputBytes > 0 && len(text) > l.MaxInputBytes {
		return dst, inputLimitErr(len(text), l.MaxInputBytes)
	}
	ids, err := m.tok.EncodeLimited(growFor(dst, text, l.Encode.MaxTokens), text, addSpecial, m.cache, l.Encode)
	return ids, encodeErr(err)
}

// inputLimitErr is the error for n bytes of text to tokenize, over limit.
func inputLimitErr(n, limit int) error {
	return &LimitError{Limit: "MaxInputBytes", Message: fmt.Sprintf("%d bytes of text to tokenize exceed the limit of %d", n, limit)}
}

// encodeErr is the render's error for the tokenizer's.
func encodeErr(err error) error {
	var le *tokenizer.LimitError
	switch {
	case errors.As(err, &le) && le.Tokens:
		return &LimitError{Limit: "MaxTokens", Message: fmt.Sprintf("more than %d tokens", le.Limit)}
	case errors.As(err, &le):
		return &LimitError{Limit: "MaxWordBytes", Message: fmt.Sprintf("a run of %d bytes the tokenizer cannot split (one word, or one run of spaces) is over the limit of %d", le.Got, le.Limit)}
	}
	return err
}

// Prompt appends the ids of a completions prompt to dst; addSpecial applies the tokenizer's
// template (a BOS token for Llama), as vLLM's add_special_tokens (true by default for
// completions). An error is a *LimitError, or l.Encode.Context's.
func (m *Model) Prompt(dst []int, text string, addSpecial bool, l Limits) ([]int, error) {
	return m.encode(dst, text, addSpecial, l)
}

// ChatRequest is what a chat request gives the template, as vLLM reads it. Its JSON values are
// a parsed request's: valid JSON, not validated again.
type ChatRequest struct {
	// Messages is the request's messages array (OpenAI chat format).
	Messages json.RawMessage
	// Split, when not nil, is Messages' elements, as the caller split them already (slices of
	// Messages; the media scan's): the render does not split the array again.
	Split []json.RawMessage
	// Tools is the tools array, or nil.
	Tools json.RawMessage
	// AddGenerationPrompt (default true), ContinueFinalMessage and AddSpecialTokens (default
	// false: the template writes the special tokens) are vLLM's request fields.
	AddGenerationPrompt, ContinueFinalMessage, AddSpecialTokens bool
	// Kwargs are chat_template_kwargs.
	Kwargs map[string]json.RawMessage
	// Limits bound the render.
	Limits Limits
}

// Chat renders a conversation and appends its token ids to dst. An error is the client's: a
// message the template refuses (*chattemplate.TemplateError), input past its limits
// (*LimitError, or a *chattemplate.InputError), or the context's.
func (m *Model) Chat(dst []int, r ChatRequest) ([]int, error) {
	t, err := m.ChatTokens(r)
	return t.AppendIDs(dst), err
}

// Tokens are a rendering's token ids as ChatTokens makes them: Shared, chunks the
// rendered-history cache holds, then Own; and JSON, their JSON array as the pieces it is made of
// (nil when the history cache is off: made by whoever needs it). Shared and JSON are never to be
// modified: a later turn's history goes to its legs as the cache holds it, not copied.
type Tokens struct {
	Shared [][]int32
	Own    []int
	JSON   [][]byte
}

// Len is the number of ids.
func (t Tokens) Len() int {
	n := len(t.Own)
	for _, ch := range t.Shared {
		n += len(ch)
	}
	return n
}

// AppendIDs appends the ids to dst.
func (t Tokens) AppendIDs(dst []int) []int {
	if len(t.Shared) == 0 && dst == nil {
		return t.Own
	}
	dst = slices.Grow(dst, t.Len())
	for _, ch := range t.Shared {
		for _, id := range ch {
			dst = append(dst, int(id))
		}
	}
	return append(dst, t.Own...)
}

// ChatTokens is Chat's rendering, as Tokens: with the rendered-history cache, a later turn
// shares its history's ids and their JSON with the cache, and makes only the rest.
func (m *Model) ChatTokens(r ChatRequest) (Tokens, error) {
	l := r.Limits
	var keys *historyKeys
	if m.history != nil && !r.AddSpecialTokens {
		keys = m.history.newKeys(&r)
	}
	var known func([]byte) bool
	var found []chattemplate.FoundMessage // the messages looked up in m.messages, in order
	if m.messages != nil {
		// The messages are looked up together (MessageCache.FindAll), and convertMessages asks
		// of each in turn, iterating the same split. m.messages is made with m.history: a
		// message's hash serves both.
		if !usableSplit(r.Messages, r.Split) {
			r.Split = nil
			for msg := range body.Elements(r.Messages) {
				r.Split = append(r.Split, msg)
			}
		}
		found = m.messages.FindAll(make([]chattemplate.FoundMessage, 0, len(r.Split)), r.Split)
		if keys != nil {
			for i, f := range found {
				keys.add(len(r.Split[i]), f.Hash())
			}
		}
		next := 0
		known = func([]byte) bool {
			next++
			return found[next-1].Found()
		}
	}
	msgs, items, err := convertMessages(r.Messages, r.Split, m.contentFormat, m.messages != nil, known)
	if err != nil {
		return Tokens{}, err
	}
	tmpl := m.tmpl
	if l.MaxInputBytes > 0 || l.MaxValues > 0 {
		tl := tmpl.Limits()
		tl.MaxInputBytes, tl.MaxValues = cmp.Or(l.MaxInputBytes, tl.MaxInputBytes), cmp.Or(l.MaxValues, tl.MaxValues)
		tmpl = tmpl.WithLimits(tl)
	}
	// A conversation the history cache holds is expected to render as it did: its text is
	// compared, not copied again.
	var history *historyEntry
	var expect []string
	if keys != nil {
		if history = m.history.find(keys.keys); history != nil {
			expect = history.text
		}
	}
	var spans []jinja.Span // the iterations' outputs in text: the history entry keeps them as they are
	matched, text, err := tmpl.RenderAfter(msgs, chattemplate.Options{Tools: r.Tools, AddGenerationPrompt: r.AddGenerationPrompt,
		ContinueFinalMessage: r.ContinueFinalMessage, Kwargs: r.Kwargs, Validated: true, Strings: m.strings,
		MessageCache: m.messages, MessageItems: items, MessageFound: found, Iterations: m.iterations, Spans: &spans}, expect)
	var ie *chattemplate.InputError
	switch {
	case errors.As(err, &ie) && ie.Limit != "":
		return Tokens{}, &LimitError{Limit: ie.Limit, Message: ie.Message}
	case err != nil:
		return Tokens{}, err
	}
	if ctx := l.Encode.Context; ctx != nil && ctx.Err() != nil {
		return Tokens{}, ctx.Err()
	}
	if keys != nil {
		return m.chatHistory(history, matched, text, spans, keys.keys, l)
	}
	ids, err := m.encode(nil, text, r.AddSpecialTokens, l)
	return Tokens{Own: ids}, err
}

// growFor makes room in dst for the ids of text, at 3 bytes a token (English prose takes about
// 4; code, CJK and emoji fewer), so that a long prompt's ids are not copied as they grow; no
// more than maxTokens (when set) allows.
func growFor(dst []int, text string, maxTokens int) []int {
	n := len(text)/3 + 8
	if maxTokens > 0 {
		n = min(n, maxTokens+8)
	}
	return slices.Grow(dst, n)
}
