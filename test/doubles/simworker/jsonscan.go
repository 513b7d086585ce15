package simworker

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"
)

// The worker's own reading of JSON. It shares nothing with the coordinator's parser
// (dataplane/state/body): a double that parsed with the code it checks could not catch a bug in
// it. It validates as encoding/json does (RFC 8259: literals, numbers, strings with their
// escapes and no raw control characters; bytes that are not UTF-8 are the decoder's concern, as
// with encoding/json) and splits objects and arrays into raw members, without decoding values.

// errInvalidJSON reports a body that is not JSON, errNotObject one that is not an object.
var (
	errInvalidJSON = errors.New("invalid JSON")
	errNotObject   = errors.New("request body must be a JSON object")
)

// maxNesting bounds the nesting of containers (encoding/json's limit).
const maxNesting = 10000

// object is a JSON object split into its members, in order; values are raw, subslices of the
// input.
type object struct {
	fields []field
}

// field is one member of an object: its decoded key and raw value.
type field struct {
	Key   string
	Value json.RawMessage
}

// Fields are the object's members in order.
func (o *object) Fields() []field { return o.fields }

// Len is the number of members.
func (o *object) Len() int { return len(o.fields) }

// Get returns the raw value of the last member named key.
func (o *object) Get(key string) (json.RawMessage, bool) {
	for i := len(o.fields) - 1; i >= 0; i-- {
		if o.fields[i].Key == key {
			return o.fields[i].Value, true
		}
	}
	return nil, false
}

// validJSON reports whether b is one JSON value, surrounded by whitespace at most.
func validJSON(b []byte) bool {
	s := scan{b: b}
	s.space()
	if !s.value(0) {
		return false
	}
	s.space()
	return s.i == len(b)
}

// parseJSON validates data and splits the object it holds; errInvalidJSON when it is not JSON,
// an error naming the kind when it is JSON but not an object.
func parseJSON(data []byte) (*object, error) {
	if !validJSON(data) {
		return nil, errInvalidJSON
	}
	return splitObject(data)
}

// splitObject splits raw, a valid JSON value, when it is an object.
func splitObject(raw []byte) (*object, error) {
	s := scan{b: raw}
	s.space()
	if s.i >= len(raw) || raw[s.i] != '{' {
		return nil, errNotObject
	}
	o := &object{}
	s.i++
	for s.space(); raw[s.i] != '}'; {
		ks := s.i
		s.skipString()
		key, err := decodeKey(raw[ks:s.i])
		if err != nil {
			return nil, err
		}
		s.space()
		s.i++ // :
		s.space()
		vs := s.i
		s.skip()
		o.fields = append(o.fields, field{Key: key, Value: raw[vs:s.i]})
		if s.space(); raw[s.i] == ',' {
			s.i++
			s.space()
		}
	}
	return o, nil
}

// splitArray splits raw, a valid JSON array, into its raw elements.
func splitArray(raw []byte) ([]json.RawMessage, error) {
	s := scan{b: raw}
	s.space()
	if s.i >= len(raw) || raw[s.i] != '[' {
		return nil, errors.New("not a JSON array")
	}
	var out []json.RawMessage
	s.i++
	for s.space(); raw[s.i] != ']'; {
		start := s.i
		s.skip()
		out = append(out, raw[start:s.i])
		if s.space(); raw[s.i] == ',' {
			s.i++
			s.space()
		}
	}
	return out, nil
}

// decodeKey is the text of a string token (quotes included), as encoding/json decodes it.
func decodeKey(tok []byte) (string, error) {
	if inner := tok[1 : len(tok)-1]; !containsByte(inner, '\\') && utf8.Valid(inner) {
		return string(inner), nil
	}
	var k string
	err := json.Unmarshal(tok, &k)
	return k, err
}

func containsByte(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}

// skip moves past the value at s.i of valid JSON without checking it: a string to its closing
// quote (found with the vectorised byte search: a media string is megabytes of base64), a
// container to its close, a number or literal to its end.
func (s *scan) skip() {
	switch s.b[s.i] {
	case '"':
		s.skipString()
	case '{', '[':
		depth := 0
		for {
			switch s.b[s.i] {
			case '"':
				s.skipString()
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
			}
			s.i++
			if depth == 0 {
				return
			}
		}
	default:
		for s.i < len(s.b) && !elementEnd[s.b[s.i]] && s.b[s.i] != '}' {
			s.i++
		}
	}
}

// skipString moves past the valid string at s.i.
func (s *scan) skipString() {
	for j := s.i + 1; ; {
		q := j + bytes.IndexByte(s.b[j:], '"')
		back := 0
		for k := q - 1; s.b[k] == '\\'; k-- {
			back++
		}
		if back%2 == 0 {
			s.i = q + 1
			return
		}
		j = q + 1
	}
}

// scan is a position in JSON text.
type scan struct {
	b []byte
	i int
}

func (s *scan) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// value reads one value at s.i, reporting whether it is valid.
func (s *scan) value(depth int) bool {
	if s.i >= len(s.b) {
		return false
	}
	switch c := s.b[s.i]; {
	case c == '{':
		return depth < maxNesting && s.container('}', depth)
	case c == '[':
		return depth < maxNesting && s.container(']', depth)
	case c == '"':
		return s.str()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	}
	return false
}

// container reads an object (members) or an array (elements) up to closing.
func (s *scan) container(closing byte, depth int) bool {
	s.i++
	s.space()
	if s.i < len(s.b) && s.b[s.i] == closing {
		s.i++
		return true
	}
	for {
		if closing == '}' {
			if s.i >= len(s.b) || s.b[s.i] != '"' || !s.str() {
				return false
			}
			s.space()
			if s.i >= len(s.b) || s.b[s.i] != ':' {
				return false
			}
			s.i++
			s.space()
		}
		if !s.value(depth + 1) {
			return false
		}
		s.space()
		if s.i >= len(s.b) {
			return false
		}
		switch s.b[s.i] {
		case ',':
			s.i++
			s.space()
		case closing:
			s.i++
			return true
		default:
			return false
		}
	}
}

func (s *scan) literal(lit string) bool {
	if len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
func (s *scan) number() bool {
	if s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case s.digits() == 0:
		return false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if s.digits() == 0 {
			return false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if s.digits() == 0 {
			return false
		}
	}
	return true
}

func (s *scan) digits() int {
	n := 0
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
		n++
	}
	return n
}

// str reads a string: its plain runs eight bytes at a time (media strings are megabytes of
// base64), escapes one by one.
func (s *scan) str() bool {
	s.i++ // "
	for {
		s.i += plainRun(s.b[s.i:])
		if s.i >= len(s.b) {
			return false
		}
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return true
		case c == '\\':
			if !s.escape() {
				return false
			}
		case c < 0x20:
			return false
		default:
			s.i++
		}
	}
}

// plainRun is how many leading bytes of b, in whole words of eight, hold no quote, backslash or
// control character.
func plainRun(b []byte) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	n := 0
	for ; len(b)-n >= 8; n += 8 {
		x := binary.LittleEndian.Uint64(b[n : n+8])
		q, bs := x^ones*'"', x^ones*'\\'
		// A zero byte in q or bs (a quote, a backslash), or a byte under 0x20 in x.
		if ((q-ones)&^q|(bs-ones)&^bs|(x-ones*0x20)&^x)&highs != 0 {
			break
		}
	}
	return n
}

// escape reads one escape sequence.
func (s *scan) escape() bool {
	if s.i+1 >= len(s.b) {
		return false
	}
	switch s.b[s.i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		s.i += 2
		return true
	case 'u':
		if s.i+6 > len(s.b) {
			return false
		}
		if _, err := strconv.ParseUint(string(s.b[s.i+2:s.i+6]), 16, 16); err != nil {
			return false
		}
		s.i += 6
		return true
	}
	return false
}
