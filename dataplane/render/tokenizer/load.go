package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
)

// Tokenizer encodes text into the ids of one Hugging Face tokenizer.json: byte-level BPE (GPT-2,
// Llama 3, Qwen, DeepSeek, gpt-oss) or BPE over characters with byte fallback, SentencePiece
// style (Llama 2, Mistral, Gemma).
// It is immutable after Load/New and safe for concurrent use.
type Tokenizer struct {
	vocab     vocabIndex
	merges    mergeTable
	ignoreMrg bool
	words     wordCache

	added   addedTokens
	norm    []normStep
	form    *unicodeNorm // the normalizer when it is one Unicode form (NFC for Qwen), else nil
	pre     []preStep
	byteLvl *byteLevel     // the final ByteLevel step; nil for a literal vocabulary (sp)
	alpha   alphabet       // how the vocabulary spells bytes
	sp      *sentencePiece // the model of a literal vocabulary, else nil

	prefix, suffix []int  // the post-processor's ids around the encoded text
	firstDiffers   bool   // a text's first section encodes differently (Metaspace "first")
	deepSeek       bool   // the pre-tokenizer is DeepSeek-V3's, then a plain ByteLevel: encodeDeepSeek
	serial         uint64 // tells apart tokenizers sharing a SegmentCache

	scratch sync.Pool // *state
}

var serials atomic.Uint64

// Load reads dir/tokenizer.json (the only file it needs; tokenizer_config.json is the chat template's business).
func Load(dir string) (*Tokenizer, error) {
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	return New(b)
}

// rawTokenizer is the part of tokenizer.json that encoding reads. Polymorphic parts stay raw
// and are decoded by their own parsers, which know the JSON path for their errors.
type rawTokenizer struct {
	AddedTokens   []rawAddedToken `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Model         *rawModel       `json:"model"`
	PostProcessor json.RawMessage `json:"post_processor"`
}

type rawAddedToken struct {
	ID         *int   `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type rawModel struct {
	Type                    *string         `json:"type"`
	Dropout                 *float64        `json:"dropout"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	ByteFallback            bool            `json:"byte_fallback"`
	UnkToken                *string         `json:"unk_token"`
	FuseUnk                 bool            `json:"fuse_unk"`
	IgnoreMerges            bool            `json:"ignore_merges"`
	Vocab                   json.RawMessage `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
}

// loadError is an error about one field of tokenizer.json.
type loadError struct {
	path, reason string
}

func (e *loadError) Error() string { return e.path + ": " + e.reason }

func errAt(path, format string, args ...any) error {
	return &loadError{path: path, reason: fmt.Sprintf(format, args...)}
}

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// typeOf decodes the "type" field of a component.
func typeOf(path string, raw json.RawMessage) (string, error) {
	var v struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", errAt(path, "%v", err)
	}
	if v.Type == "" {
		return "", errAt(path+".type", "missing")
	}
	return v.Type, nil
}

// New builds a tokenizer from the bytes of a tokenizer.json.
func New(tokenizerJSON []byte) (*Tokenizer, error) {
	var raw rawTokenizer
	if err := json.Unmarshal(tokenizerJSON, &raw); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	t := &Tokenizer{serial: serials.Add(1)}

	var err error
	if t.norm, err = parseNormalizer("normalizer", raw.Normalizer); err != nil {
		return nil, err
	}
	if len(t.norm) == 1 {
		if u, ok := t.norm[0].(unicodeNorm); ok {
			t.form = &u
		}
	}
	if t.pre, t.byteLvl, err = parsePreTokenizer(raw.PreTokenizer); err != nil {
		return nil, err
	}
	if t.byteLvl == nil {
		t.alpha = literalAlphabet
	}
	for _, p := range t.pre {
		t.firstDiffers = t.firstDiffers || p.meta != nil && p.meta.first
	}
	t.deepSeek = isDeepSeek(t.pre) && t.byteLvl != nil && !t.byteLvl.addPrefixSpace && !t.byteLvl.useRegex
	if raw.Model == nil {
		return nil, errAt("model", "missing")
	}
	if err := t.parseModel(raw.Model, raw.AddedTokens); err != nil {
		return nil, err
	}
	if t.prefix, t.suffix, err = t.parsePostProcessor("post_processor", raw.PostProcessor); err != nil {
		return nil, err
	}
	if t.sp != nil {
		t.sp.readRaw(t)
	}
	t.words.init()
	t.scratch.New = func() any { return new(state) }
	return t, nil
}

// parseModel validates the BPE model and builds the vocabulary, merges and added tokens.
func (t *Tokenizer) parseModel(m *rawModel, added []rawAddedToken) error {
	switch {
	case m.Type == nil && isNull(m.Merges):
		return errAt("model.type", "missing (BPE only)")
	case m.Type != nil && *m.Type != "BPE":
		return errAt("model.type", "%q is not supported (BPE only)", *m.Type)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return errAt("model.dropout", "%v is not supported (null only)", *m.Dropout)
	}
	if m.ByteFallback && t.alpha == byteLevelAlphabet {
		return errAt("model.byte_fallback", "true is not supported with a ByteLevel pre-tokenizer (byte-level vocabularies spell every byte)")
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" {
		return errAt("model.continuing_subword_prefix", "%q is not supported (empty or null only)", *m.ContinuingSubwordPrefix)
	}
	if m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return errAt("model.end_of_word_suffix", "%q is not supported (empty or null only)", *m.EndOfWordSuffix)
	}
	if isNull(m.Vocab) {
		return errAt("model.vocab", "missing")
	}
	vocab, err := parseVocab(m.Vocab)
	if err != nil {
		return errAt("model.vocab", "%v", err)
	}
	merges, err := splitArray(m.Merges)
	if err != nil {
		return errAt("model.merges", "%v", err)
	}
	t.ignoreMrg = m.IgnoreMerges

	// Added tokens override vocabulary entries of the same content, as in the reference
	// (tokens_to_ids.set(content, id)): merges, bytes and ignore_merges all see the union.
	addedIDs := make(map[string]int, len(added))
	for i, a := range added {
		if a.ID == nil || *a.ID < 0 {
			return errAt(fmt.Sprintf("added_tokens[%d].id", i), "missing or negative")
		}
		addedIDs[a.Content] = *a.ID
	}
	if err := t.vocab.build(vocab, addedIDs, t.alpha); err != nil {
		return err
	}
	if t.alpha == literalAlphabet {
		if t.sp, err = newSentencePiece(vocab, m, addedIDs); err != nil {
			return err
		}
	} else {
		for b := 0; b < 256; b++ {
			id, ok := t.vocab.lookup(string([]byte{byte(b)}))
			if !ok {
				return errAt("model.vocab", "byte 0x%02X (%q) is missing: not a byte-level vocabulary", b, string(byteToRune[b]))
			}
			t.merges.byteID[b] = int32(id)
		}
	}
	if err := t.merges.build(merges, &t.vocab, t.alpha); err != nil {
		return err
	}
	if t.sp != nil {
		t.sp.readDigits(&t.merges)
	}
	return t.added.build(added, t.norm)
}

// parsePostProcessor returns the ids a post-processor puts before and after the text.
func (t *Tokenizer) parsePostProcessor(path string, raw json.RawMessage) (prefix, suffix []int, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	typ, err := typeOf(path, raw)
	if err != nil {
		return nil, nil, err
	}
	switch typ {
	case "ByteLevel":
		return nil, nil, nil // offsets only
	case "Sequence":
		var v struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, nil, errAt(path, "%v", err)
		}
		for i, p := range v.Processors {
			pp, ss, err := t.parsePostProcessor(fmt.Sprintf("%s.processors[%d]", path, i), p)
			if err != nil {
				return nil, nil, err
			}
			// Each processor wraps the previous one's output.
			prefix = append(append([]int(nil), pp...), prefix...)
			suffix = append(suffix, ss...)
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		return t.parseTemplate(path, raw)
	case "BertProcessing", "RobertaProcessing":
		var v struct {
			Cls []json.RawMessage `json:"cls"`
			Sep []json.RawMessage `json:"sep"`
		}
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, nil, errAt(path, "%v", err)
		}
		cls, err := t.specialPair(path+".cls", v.Cls)
		if err != nil {
			return nil, nil, err
		}
		sep, err := t.specialPair(path+".sep", v.Sep)
		if err != nil {
			return nil, nil, err
		}
		return []int{cls}, []int{sep}, nil
	default:
		return nil, nil, errAt(path+".type", "%q is not supported (ByteLevel, TemplateProcessing, Sequence, BertProcessing, RobertaProcessing only)", typ)
	}
}

// specialPair checks a [token, id] pair of Bert/RobertaProcessing: the reference emits the
// token's id while the Rust library emits the id, so both must agree.
func (t *Tokenizer) specialPair(path string, pair []json.RawMessage) (int, error) {
	var tok string
	var id int
	if len(pair) != 2 || json.Unmarshal(pair[0], &tok) != nil || json.Unmarshal(pair[1], &id) != nil {
		return 0, errAt(path, "want [token, id]")
	}
	got, ok := t.TokenID(tok)
	if !ok || got != id {
		return 0, errAt(path, "token %q is not id %d in the vocabulary", tok, id)
	}
	return id, nil
}

func (t *Tokenizer) parseTemplate(path string, raw json.RawMessage) (prefix, suffix []int, err error) {
	type special struct {
		ID string `json:"id"`
	}
	type sequence struct {
		ID string `json:"id"`
	}
	var v struct {
		Single []struct {
			SpecialToken *special  `json:"SpecialToken"`
			Sequence     *sequence `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, nil, errAt(path, "%v", err)
	}
	seen := false
	for i, item := range v.Single {
		ipath := fmt.Sprintf("%s.single[%d]", path, i)
		switch {
		case item.Sequence != nil:
			if item.Sequence.ID != "A" || seen {
				return nil, nil, errAt(ipath, "only one Sequence A is supported in a single template")
			}
			seen = true
		case item.SpecialToken != nil:
			name := item.SpecialToken.ID
			st, ok := v.SpecialTokens[name]
			// The Rust library emits special_tokens[name].ids; the reference emits the id of
			// the token named name. Refuse a template on which they disagree.
			id, found := t.TokenID(name)
			if !ok || len(st.IDs) != 1 || !found || st.IDs[0] != id {
				return nil, nil, errAt(ipath, "special token %q must be in special_tokens with exactly its own id", name)
			}
			if seen {
				suffix = append(suffix, id)
			} else {
				prefix = append(prefix, id)
			}
		default:
			return nil, nil, errAt(ipath, "neither SpecialToken nor Sequence")
		}
	}
	if !seen {
		return nil, nil, errAt(path+".single", "no Sequence A")
	}
	return prefix, suffix, nil
}

// TokenID returns the id of an added token or vocabulary entry (spelled as in tokenizer.json).
func (t *Tokenizer) TokenID(token string) (int, bool) {
	if id, ok := t.added.byContent[token]; ok {
		return id, true
	}
	if raw, ok := t.alpha.decode(token); ok {
		return t.vocab.lookup(raw)
	}
	id, ok := t.vocab.other[token]
	return id, ok
}

// VocabSize is the number of ids (vocabulary plus added tokens): the largest id plus one.
func (t *Tokenizer) VocabSize() int { return len(t.vocab.byID) }

// fromByteLevel maps a byte-level token (GPT-2's bytes_to_unicode alphabet) back to its bytes.
func fromByteLevel(s string) (string, bool) {
	var buf [64]byte
	out := buf[:0]
	for _, r := range s {
		if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return "", false
		}
		out = append(out, byte(runeToByte[r]))
	}
	return string(out), true
}

// byteToRune is GPT-2's bytes_to_unicode; runeToByte its inverse (-1: not in the alphabet).
var byteToRune, runeToByte = func() ([256]rune, [324]int16) {
	var b2r [256]rune
	var r2b [324]int16
	for i := range r2b {
		r2b[i] = -1
	}
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
		r2b[b2r[b]] = int16(b)
	}
	return b2r, r2b
}()

// splitArray returns the raw elements of a JSON array without decoding them (tokenizer.json's
// merges: hundreds of thousands of small elements that encoding/json decodes slowly).
func splitArray(raw []byte) ([][]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '[' || raw[len(raw)-1] != ']' {
		return nil, fmt.Errorf("not an array")
	}
	var out [][]byte
	for i := 1; ; {
		i = skipSpace(raw, i)
		if raw[i] == ']' && len(out) == 0 {
			return out, nil
		}
		end, err := valueEnd(raw, i)
		if err != nil {
			return nil, err
		}
		out = append(out, raw[i:end])
		i = skipSpace(raw, end)
		switch raw[i] {
		case ',':
			i++
		case ']':
			if i != len(raw)-1 {
				return nil, fmt.Errorf("trailing data")
			}
			return out, nil
		default:
			return nil, fmt.Errorf("want ',' or ']' at offset %d", i)
		}
	}
}

// parseVocab decodes the vocab object; keys without escapes are taken as they are.
func parseVocab(raw []byte) (map[string]int, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '{' || raw[len(raw)-1] != '}' {
		return nil, fmt.Errorf("not an object")
	}
	out := make(map[string]int, bytes.Count(raw, []byte{':'}))
	for i := 1; ; {
		i = skipSpace(raw, i)
		if raw[i] == '}' && len(out) == 0 {
			return out, nil
		}
		kend, err := valueEnd(raw, i)
		if err != nil || raw[i] != '"' {
			return nil, fmt.Errorf("bad key at offset %d", i)
		}
		key, err := jsonString(raw[i:kend])
		if err != nil {
			return nil, err
		}
		i = skipSpace(raw, kend)
		if raw[i] != ':' {
			return nil, fmt.Errorf("want ':' at offset %d", i)
		}
		i = skipSpace(raw, i+1)
		vend, err := valueEnd(raw, i)
		if err != nil {
			return nil, err
		}
		id, err := strconv.Atoi(string(raw[i:vend]))
		if err != nil {
			return nil, fmt.Errorf("%q: id %s is not an integer", key, raw[i:vend])
		}
		out[key] = id
		i = skipSpace(raw, vend)
		switch raw[i] {
		case ',':
			i++
		case '}':
			if i != len(raw)-1 {
				return nil, fmt.Errorf("trailing data")
			}
			return out, nil
		default:
			return nil, fmt.Errorf("want ',' or '}' at offset %d", i)
		}
	}
}

// jsonString decodes a JSON string, without encoding/json when it has no escapes.
func jsonString(raw []byte) (string, error) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' && bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return min(i, len(b)-1)
}

// valueEnd returns the end of the JSON value (string, number, or nested array/object of them)
// at b[i]. The document has already been validated by encoding/json.
func valueEnd(b []byte, i int) (int, error) {
	depth := 0
	for j := i; j < len(b); j++ {
		switch b[j] {
		case '"':
			for j++; j < len(b) && b[j] != '"'; j++ {
				if b[j] == '\\' {
					j++
				}
			}
			if depth == 0 {
				return j + 1, nil
			}
		case '[', '{':
			depth++
		case ']', '}':
			if depth == 0 {
				return j, nil
			}
			depth--
			if depth == 0 {
				return j + 1, nil
			}
		case ',', ':', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return j, nil
			}
		}
	}
	if depth == 0 {
		return len(b), nil
	}
	return 0, fmt.Errorf("unterminated value at offset %d", i)
}
