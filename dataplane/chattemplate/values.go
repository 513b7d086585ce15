package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/ardanlabs/jinja"

	"github.com/epd-dev/coordinator/dataplane/body"
)

// decodeValue converts JSON to a template value as Python's json.loads would: objects keep their
// keys in document order (a repeated key keeps its first position and its last value), integers
// stay integers and anything with a fraction or exponent is a float. An integer outside int64
// becomes a float (Python would keep it exact). Nesting deeper than maxDepth is an error.
//
// data is validated once (unless validated says it was already) and walked without a decoder; a
// string without escapes shares data's memory (a long message is not copied), so data must not
// change while the value is in use.
func decodeValue(data []byte, maxDepth int, validated bool) (jinja.Value, error) {
	if !validated && !body.Valid(data) {
		return jinja.Undefined(), errors.New("invalid JSON")
	}
	return walkValue(bytes.TrimSpace(data), maxDepth, 0)
}

func walkValue(raw []byte, maxDepth, depth int) (jinja.Value, error) {
	switch body.KindOf(raw) {
	case body.KindNull:
		return jinja.None(), nil
	case body.KindBool:
		return jinja.NewBool(raw[0] == 't'), nil
	case body.KindNumber:
		return numberValue(json.Number(raw)), nil
	case body.KindString:
		return jinja.NewString(stringOf(raw)), nil
	}
	if depth >= maxDepth {
		return jinja.Undefined(), fmt.Errorf("JSON nested deeper than %d levels", maxDepth)
	}
	if body.KindOf(raw) == body.KindArray {
		var items []jinja.Value
		for item := range body.Elements(raw) {
			v, err := walkValue(item, maxDepth, depth+1)
			if err != nil {
				return jinja.Undefined(), err
			}
			items = append(items, v)
		}
		return jinja.NewList(items), nil
	}
	obj := jinja.NewDict()
	d := obj.AsDict()
	for k, item := range body.Members(raw) {
		v, err := walkValue(item, maxDepth, depth+1)
		if err != nil {
			return jinja.Undefined(), err
		}
		d.Set(k, v)
	}
	return obj, nil
}

// stringOf is the text of raw, a valid JSON string: its bytes when they need no decoding (no
// escape, valid UTF-8), else a decoded copy.
func stringOf(raw []byte) string {
	inner := raw[1 : len(raw)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		if len(inner) == 0 {
			return ""
		}
		return unsafe.String(&inner[0], len(inner))
	}
	s, _ := body.AppendString(nil, raw)
	if len(s) == 0 {
		return ""
	}
	return unsafe.String(&s[0], len(s)) // s is this string's own: no second copy
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
