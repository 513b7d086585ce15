package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unsafe"

	simdutf8 "github.com/segmentio/asm/utf8"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"

	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// decodeValue converts JSON to a template value as Python's json.loads would: objects keep their
// keys in document order (a repeated key keeps its first position and its last value), integers
// stay integers and anything with a fraction or exponent is a float. An integer outside int64
// becomes a float (Python would keep it exact). Nesting deeper than maxDepth is an error.
//
// data is validated once (unless validated says it was already) and walked without a decoder; a
// string without escapes shares data's memory (a long message is not copied), so data must not
// change while the value is in use.
//
// left, when not nil, is how many more values may be decoded (a request's budget across its
// inputs); past it the error is errTooManyValues. strs, when not nil, holds long strings decoded
// before.
func decodeValue(data []byte, maxDepth int, validated bool, left *int, strs *StringCache) (jinja.Value, error) {
	if !validated && !body.Valid(data) {
		return jinja.Undefined(), errors.New("invalid JSON")
	}
	if left == nil {
		unlimited := int(^uint(0) >> 1)
		left = &unlimited
	}
	w := walker{data: data, maxDepth: maxDepth, left: left, strs: strs}
	return w.value(0)
}

// errTooManyValues is a decoding stopped by its count of values.
var errTooManyValues = errors.New("too many JSON values")

// tooDeep is a decoding stopped by its depth limit.
type tooDeep int

func (d tooDeep) Error() string { return fmt.Sprintf("JSON nested deeper than %d levels", int(d)) }

// walker walks valid JSON in one pass: a container does not skip its values before they are
// decoded, and a string is decoded where its end is found.
type walker struct {
	data     []byte
	pos      int
	maxDepth int
	left     *int         // values that may still be decoded
	strs     *StringCache // nil: none
	deepest  int          // the depth of the deepest container decoded
	copied   int          // the bytes of the strings decoded into copies of their own
}

func (w *walker) space() {
	for w.pos < len(w.data) {
		switch w.data[w.pos] {
		case ' ', '\t', '\n', '\r':
			w.pos++
		default:
			return
		}
	}
}

// value decodes the value at pos, depth containers deep.
func (w *walker) value(depth int) (jinja.Value, error) {
	if *w.left--; *w.left < 0 {
		return jinja.Undefined(), errTooManyValues
	}
	w.space()
	if w.pos >= len(w.data) {
		return jinja.Undefined(), errors.New("unexpected end of JSON")
	}
	switch c := w.data[w.pos]; c {
	case 'n':
		w.pos += len("null")
		return jinja.None(), nil
	case 't':
		w.pos += len("true")
		return jinja.NewBool(true), nil
	case 'f':
		w.pos += len("false")
		return jinja.NewBool(false), nil
	case '"':
		return jinja.NewString(w.str()), nil
	case '[', '{':
		if depth >= w.maxDepth {
			return jinja.Undefined(), tooDeep(w.maxDepth)
		}
		w.deepest = max(w.deepest, depth)
		w.pos++
		if c == '[' {
			return w.list(depth)
		}
		return w.dict(depth)
	}
	start := w.pos
	for w.pos < len(w.data) && strings.IndexByte("0123456789+-.eE", w.data[w.pos]) >= 0 {
		w.pos++
	}
	return numberValue(json.Number(w.data[start:w.pos])), nil
}

// list decodes an array's elements, its '[' read.
func (w *walker) list(depth int) (jinja.Value, error) {
	var items []jinja.Value
	for {
		w.space()
		switch w.data[w.pos] {
		case ']':
			w.pos++
			return jinja.NewList(items), nil
		case ',':
			w.pos++
		}
		v, err := w.value(depth + 1)
		if err != nil {
			return jinja.Undefined(), err
		}
		items = append(items, v)
	}
}

// dict decodes an object's members, its '{' read. The members are gathered first, so that the
// dict's key list is made at its size, not grown member by member (a conversation is hundreds
// of small objects; its map, made by the engine, holds up to eight keys in its first group).
func (w *walker) dict(depth int) (jinja.Value, error) {
	type member struct {
		key string
		val jinja.Value
	}
	var buf [8]member
	members := buf[:0]
	for {
		w.space()
		switch w.data[w.pos] {
		case '}':
			w.pos++
			obj := jinja.NewDict()
			d := obj.AsDict()
			d.Keys = make([]string, 0, len(members))
			for _, m := range members {
				d.Set(m.key, m.val) // a repeated key keeps its first position and its last value
			}
			return obj, nil
		case ',':
			w.pos++
			w.space()
		}
		k := w.str()
		w.space()
		w.pos++ // ':'
		v, err := w.value(depth + 1)
		if err != nil {
			return jinja.Undefined(), err
		}
		members = append(members, member{k, v})
	}
}

// str decodes the string at pos: its bytes when they need no decoding (no escape, valid UTF-8),
// else a decoded copy, or the copy strs holds of a long one.
func (w *walker) str() string {
	rest := w.data[w.pos+1:]
	if q := bytes.IndexByte(rest, '"'); bytes.IndexByte(rest[:q], '\\') < 0 && simdutf8.Valid(rest[:q]) {
		w.pos += q + 2
		if q == 0 {
			return ""
		}
		return unsafe.String(&rest[0], q)
	}
	end := body.StringEnd(w.data[w.pos:])
	if end < 0 { // unterminated: only data decodeValue's caller wrongly vouched for has one
		w.pos = len(w.data)
		return ""
	}
	raw := w.data[w.pos : w.pos+end+1] // the string's JSON text, quotes included
	w.pos += len(raw)
	cached := w.strs != nil && len(raw) >= minCachedString
	var key uint64
	if cached {
		text, k, ok := w.strs.get(raw)
		if ok {
			return text
		}
		key = k
	}
	s, _ := body.Unescape(nil, raw[1:len(raw)-1])
	if len(s) == 0 {
		return ""
	}
	text := unsafe.String(&s[0], len(s)) // s is this string's own: no second copy
	if cached {
		w.strs.put(key, raw, text)
	} else {
		w.copied += len(s)
	}
	return text
}

func numberValue(n json.Number) jinja.Value {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if i, err := strconv.ParseInt(s, 10, 64); err == nil {
			return jinja.NewInt(i)
		}
	}
	f, _ := strconv.ParseFloat(s, 64) // the decoder validated the syntax; ±Inf on overflow, as Python
	return jinja.NewFloat(f)
}
