// Package body holds a request body parsed once: a JSON object kept as its top-level keys in order,
// each with its raw, still-encoded value. Building the body of a worker leg means overriding a few
// top-level keys; every other value, however large (messages with base64 images, token arrays), is
// copied through as the client sent it and never decoded or re-encoded.
package body

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net"
	"slices"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	simdutf8 "github.com/segmentio/asm/utf8"
)

// ErrNotObject is returned by Parse for valid JSON that is not an object (null, an array, a string...).
var ErrNotObject = errors.New("request body must be a JSON object")

// ErrInvalidJSON is returned by Parse for bytes that are not valid JSON.
var ErrInvalidJSON = errors.New("request body is not valid JSON")

// Field is one top-level member of an Object.
type Field struct {
	// Key is the decoded member name.
	Key string
	// Value is the member's raw JSON value (nil while the value is held as segments).
	Value json.RawMessage
	// segs, when set, is the value as consecutive pieces (see SetSegments).
	segs [][]byte
}

// raw returns the field's value, joining segments on demand.
func (f *Field) raw() json.RawMessage {
	if f.segs != nil && f.Value == nil {
		f.Value = bytes.Join(f.segs, nil)
	}
	return f.Value
}

func (f *Field) size() int {
	if f.segs == nil {
		return len(f.Value)
	}
	n := 0
	for _, s := range f.segs {
		n += len(s)
	}
	return n
}

// Object is a JSON object as an ordered list of raw members. The zero value is an empty object.
// An Object shares the byte slices it was parsed from: callers must not modify them.
type Object struct {
	fields []Field
}

// Parse validates data as JSON and splits a top-level object into its members without copying
// their values. Duplicate keys keep their first position and the last value, as encoding/json does.
func Parse(data []byte) (*Object, error) {
	if !Valid(data) {
		return nil, ErrInvalidJSON
	}
	return parseObject(data, topLevelFields)
}

// ParseNested splits an object without validating it again: data must be a value taken from a
// parsed Object or Array (already validated). Nested edits use it so that a large body is
// validated once, not once per level.
func ParseNested(data []byte) (*Object, error) {
	return parseObject(data, nestedFields)
}

// parseObject splits the object data holds, with room for fields members to start with.
func parseObject(data []byte, fields int) (*Object, error) {
	s := scanner{data: data}
	s.skipSpace()
	return s.object(fields)
}

// The room an object's members start with: a request body has a dozen or so, a nested object
// (a message, a content part) two to four; a conversation's hundreds of messages would
// otherwise each allocate (and clear) room for sixteen.
const (
	topLevelFields = 16
	nestedFields   = 4
)

// object parses the object at pos (its '{') as ParseNested does, and advances past it.
func (s *scanner) object(fields int) (*Object, error) {
	data := s.data
	if s.pos >= len(data) || data[s.pos] != '{' {
		return nil, ErrNotObject
	}
	s.pos++
	o := &Object{fields: make([]Field, 0, fields)}
	for s.next('}') {
		rawKey := s.value()
		key, err := decodeKey(rawKey)
		if err != nil {
			return nil, err
		}
		s.skipSpace()
		s.pos++ // ':'
		s.skipSpace()
		o.Set(key, s.value())
	}
	if s.pos >= len(data) {
		return nil, ErrInvalidJSON
	}
	s.pos++ // '}'
	return o, nil
}

// Objects yields the elements of a validated array (as Elements does) parsed as ParseNested
// parses an object, with each element's raw bytes, in one pass over the array: an element is not
// skipped before it is parsed. An element that is not an object comes with a nil Object.
func Objects(data []byte) iter.Seq2[*Object, []byte] {
	return func(yield func(*Object, []byte) bool) {
		s := scanner{data: data}
		if !s.open('[') {
			return
		}
		for s.next(']') {
			start := s.pos
			o, err := s.object(nestedFields)
			if err != nil {
				s.pos = start
				s.value()
			}
			if !yield(o, data[start:s.pos:s.pos]) {
				return
			}
		}
	}
}

// Len is the number of members.
func (o *Object) Len() int { return len(o.fields) }

// Fields returns the members in order (segmented values joined). The slice must not be modified.
func (o *Object) Fields() []Field {
	for i := range o.fields {
		o.fields[i].raw()
	}
	return o.fields
}

// Get returns the raw value of key.
func (o *Object) Get(key string) (json.RawMessage, bool) {
	if i := o.index(key); i >= 0 {
		return o.fields[i].raw(), true
	}
	return nil, false
}

// Has reports whether key is present (even with a null value).
func (o *Object) Has(key string) bool { return o.index(key) >= 0 }

// Set replaces the value of key in place, or appends the key when it is absent.
func (o *Object) Set(key string, raw json.RawMessage) {
	if i := o.index(key); i >= 0 {
		o.fields[i] = Field{Key: key, Value: raw}
		return
	}
	o.fields = append(o.fields, Field{Key: key, Value: raw})
}

// SetSegments sets key to the concatenation of segs without copying them: a leg can splice a few
// bytes into a large value (e.g. a uuid into one content part of messages) and still stream the
// large parts straight from the client's body. The segments must not be modified.
func (o *Object) SetSegments(key string, segs ...[]byte) {
	f := Field{Key: key, segs: segs}
	if i := o.index(key); i >= 0 {
		o.fields[i] = f
		return
	}
	o.fields = append(o.fields, f)
}

// Delete removes key when present.
func (o *Object) Delete(key string) {
	if i := o.index(key); i >= 0 {
		o.fields = append(o.fields[:i], o.fields[i+1:]...)
	}
}

// Clone returns a shallow copy: the member list is copied, the raw values are shared.
func (o *Object) Clone() *Object {
	c := &Object{fields: make([]Field, len(o.fields), len(o.fields)+4)}
	copy(c.fields, o.fields)
	return c
}

// Size is the number of bytes Bytes and Buffers produce.
func (o *Object) Size() int {
	n := 2 // {}
	for i, f := range o.fields {
		if i > 0 {
			n++
		}
		n += keySize(f.Key) + 1 + f.size()
	}
	return n
}

// AppendTo appends the encoded object to dst.
func (o *Object) AppendTo(dst []byte) []byte {
	dst = append(dst, '{')
	for i, f := range o.fields {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendKey(dst, f.Key)
		dst = append(dst, ':')
		if f.segs != nil {
			for _, seg := range f.segs {
				dst = append(dst, seg...)
			}
			continue
		}
		dst = append(dst, f.Value...)
	}
	return append(dst, '}')
}

// Bytes encodes the object into a new slice.
func (o *Object) Bytes() []byte { return o.AppendTo(make([]byte, 0, o.Size())) }

// MarshalJSON implements json.Marshaler.
func (o *Object) MarshalJSON() ([]byte, error) { return o.Bytes(), nil }

// Buffers returns the encoded object as the pieces it is made of — glue bytes and the shared
// values — and its exact length. Written with net.Buffers.WriteTo it becomes one vectored write.
func (o *Object) Buffers() (net.Buffers, int64) {
	// Small glue (braces, keys, commas) goes into one buffer; values are referenced, not copied.
	glue := make([]byte, 0, 16*len(o.fields)+2)
	nbufs := 2*len(o.fields) + 1
	for _, f := range o.fields {
		nbufs += len(f.segs)
	}
	bufs := make(net.Buffers, 0, nbufs)
	glue = append(glue, '{')
	start := 0
	for i, f := range o.fields {
		if i > 0 {
			glue = append(glue, ',')
		}
		glue = appendKey(glue, f.Key)
		glue = append(glue, ':')
		bufs = append(bufs, glue[start:len(glue):len(glue)])
		if f.segs != nil {
			bufs = append(bufs, f.segs...)
		} else {
			bufs = append(bufs, f.Value)
		}
		start = len(glue)
	}
	glue = append(glue, '}')
	bufs = append(bufs, glue[start:])
	return bufs, int64(o.Size())
}

// String returns the value of key when it is a JSON string.
func (o *Object) String(key string) (s string, present bool, err error) {
	raw, _ := o.Get(key)
	s, present, err = StringOf(raw)
	if errors.Is(err, errNotString) {
		err = fmt.Errorf("%q must be a string", key)
	}
	return s, present, err
}

var errNotString = errors.New("must be a string")

// StringOf returns raw, a value of a parsed body, when it is a JSON string (present is false
// when raw is empty or null).
func StringOf(raw []byte) (s string, present bool, err error) {
	if len(raw) == 0 || isNull(raw) {
		return "", false, nil
	}
	if raw[0] != '"' {
		return "", true, errNotString
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		// No escapes: the string is the bytes between the quotes. It shares the body's memory
		// (no copy of a megabyte data: URL); request bodies are never modified after parsing.
		if len(raw) == 2 {
			return "", true, nil
		}
		return unsafe.String(&raw[1], len(raw)-2), true, nil
	}
	var decoded string // on the heap only here
	err = json.Unmarshal(raw, &decoded)
	return decoded, true, err
}

// Bool returns the value of key when it is a JSON boolean.
func (o *Object) Bool(key string) (b bool, present bool, err error) {
	raw, ok := o.Get(key)
	if !ok || isNull(raw) {
		return false, false, nil
	}
	switch string(raw) {
	case "true":
		return true, true, nil
	case "false":
		return false, true, nil
	}
	return false, true, fmt.Errorf("%q must be a boolean", key)
}

// Int returns the value of key when it is a JSON integer (an integral number such as 8 or 8.0).
func (o *Object) Int(key string) (n int64, present bool, err error) {
	raw, ok := o.Get(key)
	if !ok || isNull(raw) {
		return 0, false, nil
	}
	n, err = ParseInt(raw)
	if err != nil {
		return 0, true, fmt.Errorf("%q must be an integer", key)
	}
	return n, true, nil
}

// Object returns the value of key parsed as a nested Object.
func (o *Object) Object(key string) (obj *Object, present bool, err error) {
	raw, ok := o.Get(key)
	if !ok || isNull(raw) {
		return nil, false, nil
	}
	if raw[0] != '{' {
		return nil, true, fmt.Errorf("%q must be an object", key)
	}
	obj, err = ParseNested(raw)
	return obj, true, err
}

// Kind is the JSON kind of a value.
type Kind byte

// JSON kinds (KindNone: absent).
const (
	KindNone Kind = iota
	KindObject
	KindArray
	KindString
	KindNumber
	KindBool
	KindNull
)

// Kind returns the JSON kind of key's value (KindNone when absent).
func (o *Object) Kind(key string) Kind {
	raw, ok := o.Get(key)
	if !ok {
		return KindNone
	}
	return KindOf(raw)
}

// KindOf returns the JSON kind of a raw value (KindNone when empty).
func KindOf(raw []byte) Kind {
	if len(raw) == 0 {
		return KindNone
	}
	switch raw[0] {
	case '{':
		return KindObject
	case '[':
		return KindArray
	case '"':
		return KindString
	case 't', 'f':
		return KindBool
	case 'n':
		return KindNull
	}
	return KindNumber
}

// ParseInt parses a raw JSON number that holds an integral value.
func ParseInt(raw []byte) (int64, error) {
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return n, nil
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f != float64(int64(f)) {
		return 0, fmt.Errorf("not an integer: %s", raw)
	}
	return int64(f), nil
}

func isNull(raw []byte) bool { return len(raw) == 4 && string(raw) == "null" }

func (o *Object) index(key string) int {
	for i := range o.fields {
		if o.fields[i].Key == key {
			return i
		}
	}
	return -1
}

func decodeKey(raw []byte) (string, error) {
	if bytes.IndexByte(raw, '\\') < 0 {
		if len(raw) == 2 {
			return "", nil
		}
		return unsafe.String(&raw[1], len(raw)-2), nil // shares the (never modified) body
	}
	var k string
	err := json.Unmarshal(raw, &k)
	return k, err
}

func keySize(k string) int {
	if plainKey(k) {
		return len(k) + 2
	}
	b, _ := json.Marshal(k)
	return len(b)
}

func appendKey(dst []byte, k string) []byte {
	if plainKey(k) {
		dst = append(dst, '"')
		dst = append(dst, k...)
		return append(dst, '"')
	}
	b, _ := json.Marshal(k)
	return append(dst, b...)
}

// plainKey reports whether k can be written between quotes without escaping.
func plainKey(k string) bool {
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c < 0x20 || c == '"' || c == '\\' || c >= 0x7f || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// scanner walks already-validated JSON.
type scanner struct {
	data []byte
	pos  int
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// value returns the raw span of the value starting at pos and advances past it.
func (s *scanner) value() []byte {
	start := s.pos
	switch s.data[s.pos] {
	case '"':
		s.skipString()
	case '{', '[':
		// The position is kept in a local and the bytes between the ones that matter are
		// stepped over by a table: a container of numbers (a prefill answer's block ids, tens of
		// KB) is crossed at a few instructions a byte.
		d, i, depth := s.data, s.pos, 0
		for {
			for !containerByte[d[i]] {
				i++
			}
			switch d[i] {
			case '"':
				s.pos = i
				s.skipString()
				i = s.pos
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			i++
			if depth == 0 {
				break
			}
		}
		s.pos = i
	default:
		for s.pos < len(s.data) {
			switch s.data[s.pos] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return s.data[start:s.pos:s.pos]
			}
			s.pos++
		}
	}
	return s.data[start:s.pos:s.pos]
}

// containerByte marks the bytes a container's skip stops at: quotes and brackets.
var containerByte = [256]bool{'"': true, '{': true, '[': true, '}': true, ']': true}

// shortString is how far skipString looks byte by byte before it calls IndexByte: most strings
// (keys, a token's text) end within it, and the call costs more than the loop there.
const shortString = 16

// skipString advances past the string starting at pos.
func (s *scanner) skipString() {
	for i := s.pos + 1; i < min(len(s.data), s.pos+1+shortString); i++ {
		if c := s.data[i]; c == '"' {
			s.pos = i + 1
			return
		} else if c == '\\' {
			break
		}
	}
	if end := StringEnd(s.data[s.pos:]); end >= 0 {
		s.pos += end + 1
	} else {
		s.pos = len(s.data) // unterminated: only unvalidated data has one
	}
}

// Array splits a raw JSON array into its raw elements without copying them.
func Array(raw []byte) ([]json.RawMessage, error) {
	s := scanner{data: raw}
	if !s.open('[') {
		return nil, errors.New("not an array")
	}
	var items []json.RawMessage
	for s.next(']') {
		items = append(items, s.value())
	}
	if s.pos >= len(raw) {
		return nil, errors.New("unterminated array")
	}
	return items, nil
}

// AppendArray appends the JSON array of the raw items to dst.
func AppendArray(dst []byte, items []json.RawMessage) []byte {
	dst = append(dst, '[')
	for i, it := range items {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, it...)
	}
	return append(dst, ']')
}

// Offset returns where inner starts inside outer when inner is a subslice of outer (a value
// taken from it by Parse or Array), or -1.
func Offset(outer, inner []byte) int {
	if len(inner) == 0 || len(outer) == 0 {
		return -1
	}
	d := int(uintptr(unsafe.Pointer(&inner[0])) - uintptr(unsafe.Pointer(&outer[0])))
	if d < 0 || d+len(inner) > len(outer) {
		return -1
	}
	return d
}

// Members yields the members of a validated object (data passed Valid, or is a value taken from
// one) in order: each key (decoded; a key with escapes is decoded with an allocation) and raw
// value. It allocates nothing for plain keys, and yields nothing when data is not an object.
func Members(data []byte) iter.Seq2[string, []byte] {
	return func(yield func(string, []byte) bool) {
		s := scanner{data: data}
		if !s.open('{') {
			return
		}
		for s.next('}') {
			key, err := decodeKey(s.value())
			if err != nil {
				return
			}
			s.skipSpace()
			s.pos++ // ':'
			s.skipSpace()
			if !yield(key, s.value()) {
				return
			}
		}
	}
}

// open moves past the opening c of the container at the start of the data (after white space),
// and reports whether there is one.
func (s *scanner) open(c byte) bool {
	s.skipSpace()
	if s.pos >= len(s.data) || s.data[s.pos] != c {
		return false
	}
	s.pos++
	return true
}

// next moves to the start of a container's next member or element (past white space and a
// comma), and reports false at its closing byte or the data's end.
func (s *scanner) next(closing byte) bool {
	s.skipSpace()
	if s.pos >= len(s.data) || s.data[s.pos] == closing {
		return false
	}
	if s.data[s.pos] == ',' {
		s.pos++
		s.skipSpace()
	}
	return true
}

// Elements yields the raw elements of a validated array; nothing when data is not an array.
func Elements(data []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		s := scanner{data: data}
		if !s.open('[') {
			return
		}
		for s.next(']') {
			if !yield(s.value()) {
				return
			}
		}
	}
}

// AppendQuote appends s as a JSON string to dst (AppendEscaped between quotes).
func AppendQuote(dst []byte, s string) []byte {
	dst = append(dst, '"')
	dst = AppendEscaped(dst, unsafe.Slice(unsafe.StringData(s), len(s))) // read only
	return append(dst, '"')
}

// AppendEscaped appends s escaped as the inside of a JSON string: quotes, backslashes and control
// characters escaped, U+2028 and U+2029 escaped (as encoding/json does, for JavaScript), invalid
// UTF-8 as U+FFFD; other characters, <, > and & included, as they are.
func AppendEscaped(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			if r == utf8.RuneError {
				dst = append(dst, `\ufffd`...)
			} else {
				dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			}
			start = i + size
		}
		i += size
	}
	return append(dst, s[start:]...)
}

// AppendString appends the text of raw, a validated JSON string (quotes included), to dst,
// decoding its escapes as encoding/json does (a lone surrogate, and each byte of invalid UTF-8,
// becomes U+FFFD).
func AppendString(dst, raw []byte) ([]byte, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return dst, errors.New("not a JSON string")
	}
	out, n, err := DecodeString(dst, raw)
	if err == nil && n != len(raw) {
		return out, errors.New("not a JSON string: a quote inside it")
	}
	return out, err
}

// DecodeString appends the text of the JSON string at the start of data (its opening quote at
// data[0]; data may go on past its closing quote) to dst, as AppendString does, and reports how
// many bytes of data the string took, quotes included.
func DecodeString(dst, data []byte) ([]byte, int, error) {
	if len(data) == 0 || data[0] != '"' {
		return dst, 0, errors.New("not a JSON string")
	}
	end := StringEnd(data)
	if end < 0 {
		return dst, len(data), errors.New("unterminated string")
	}
	dst, err := Unescape(dst, data[1:end])
	return dst, end + 1, err
}

// Unescape appends the text of s, the inside of a JSON string (between its quotes), to dst, as
// DecodeString does.
func Unescape(dst, s []byte) ([]byte, error) {
	valid := simdutf8.Valid(s) // the common case: checked once (with AVX2 where the CPU has it), not run by run
	dst = slices.Grow(dst, len(s))
	for i := 0; ; {
		b := bytes.IndexByte(s[i:], '\\')
		if b < 0 {
			b = len(s) - i
		}
		if valid {
			dst = append(dst, s[i:i+b]...)
		} else {
			dst = appendUTF8(dst, s[i:i+b])
		}
		if i += b; i == len(s) {
			return dst, nil
		}
		if i+1 < len(s) {
			if c := unescaped[s[i+1]]; c != 0 { // the common escapes, a new line or a quote, inline
				dst = append(dst, c)
				i += 2
				continue
			}
		}
		var err error
		if dst, i, err = appendEscape(dst, s, i); err != nil {
			return dst, err
		}
	}
}

// unescaped is what each one-character escape (the byte after the backslash) stands for: 0 for
// \u and for a byte no escape starts with.
var unescaped = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// StringEnd is the index of the closing quote of the JSON string at the start of data (its
// opening quote at data[0]), or -1.
func StringEnd(data []byte) int {
	for i := 1; ; i++ {
		q := bytes.IndexByte(data[i:], '"')
		if q < 0 {
			return -1
		}
		i += q
		// The quote is escaped when an odd number of backslashes precede it.
		n := 0
		for j := i - 1; data[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return i
		}
	}
}

// appendEscape appends what the escape at data[i] (a backslash) stands for and returns the
// index after it.
func appendEscape(dst, data []byte, i int) ([]byte, int, error) {
	if i+1 >= len(data) {
		return dst, i, errors.New("truncated escape")
	}
	c := data[i+1]
	i += 2
	if u := unescaped[c]; u != 0 {
		return append(dst, u), i, nil
	}
	if c == 'u' {
		r, ok := hex4(data[i:])
		if !ok {
			return dst, i, errors.New("bad \\u escape")
		}
		i += 4
		if utf16.IsSurrogate(r) {
			r2, ok := rune(-1), false
			if len(data) >= i+6 && data[i] == '\\' && data[i+1] == 'u' {
				r2, ok = hex4(data[i+2:])
			}
			if dec := utf16.DecodeRune(r, r2); ok && dec != utf8.RuneError {
				r, i = dec, i+6
			} else {
				r = utf8.RuneError
			}
		}
		return utf8.AppendRune(dst, r), i, nil
	}
	return dst, i, fmt.Errorf("bad escape \\%c", c)
}

// appendUTF8 appends s with each byte of invalid UTF-8 replaced by U+FFFD.
func appendUTF8(dst, s []byte) []byte {
	if utf8.Valid(s) {
		return append(dst, s...)
	}
	for len(s) > 0 {
		r, n := utf8.DecodeRune(s)
		if r == utf8.RuneError && n == 1 {
			dst = utf8.AppendRune(dst, utf8.RuneError)
		} else {
			dst = append(dst, s[:n]...)
		}
		s = s[n:]
	}
	return dst
}

func hex4(s []byte) (rune, bool) {
	if len(s) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range s[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}
