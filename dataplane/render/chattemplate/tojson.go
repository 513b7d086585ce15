package chattemplate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// jsonOptions are the json.dumps arguments HF's tojson filter exposes.
type jsonOptions struct {
	ensureASCII bool
	indent      string // "" with indented=false: single-line output
	indented    bool
	itemSep     string
	keySep      string
	sortKeys    bool
}

// filterToJSON is HF's tojson filter: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), keyword or positional in that order.
func filterToJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson: missing value")
	}
	params := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	get := func(i int) (jinja.Value, bool) {
		if v, ok := kwargs[params[i]]; ok {
			return v, true
		}
		if 1+i < len(args) {
			return args[1+i], true
		}
		return jinja.Undefined(), false
	}
	if len(args) > 1+len(params) {
		return jinja.Undefined(), fmt.Errorf("tojson: too many arguments (%d)", len(args)-1)
	}
	for k := range kwargs {
		if !slices.Contains(params, k) {
			return jinja.Undefined(), fmt.Errorf("tojson: unexpected keyword argument %q", k)
		}
	}
	o := jsonOptions{itemSep: ", ", keySep: ": "}
	if v, ok := get(0); ok {
		o.ensureASCII = v.IsTruthy()
	}
	if v, ok := get(1); ok && !v.IsNone() && !v.IsUndefined() {
		o.indented = true
		o.itemSep = ","
		switch {
		case v.IsInt():
			o.indent = strings.Repeat(" ", int(max(0, min(v.AsInt(), 64))))
		case v.IsString():
			o.indent = v.AsString()
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an int or a string, not %s", v)
		}
	}
	if v, ok := get(2); ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Get(0).IsString() || !v.AsList().Get(1).IsString() {
			return jinja.Undefined(), fmt.Errorf("tojson: separators must be a pair of strings, not %s", v)
		}
		o.itemSep, o.keySep = v.AsList().Get(0).AsString(), v.AsList().Get(1).AsString()
	}
	if v, ok := get(3); ok {
		o.sortKeys = v.IsTruthy()
	}
	var b strings.Builder
	if err := encodeJSON(&b, args[0], &o, 0); err != nil {
		return jinja.Undefined(), fmt.Errorf("tojson: %w", err)
	}
	return jinja.NewString(b.String()), nil
}

// maxJSONDepth bounds tojson's recursion; a template can build a value nested deeper than any
// decoded input (a list appended to itself), which Python would reject as circular.
const maxJSONDepth = 512

// encodeJSON writes v as Python's json.dumps does with o.
func encodeJSON(b *strings.Builder, v jinja.Value, o *jsonOptions, depth int) error {
	if depth > maxJSONDepth {
		return errors.New("value nested too deeply (circular?)")
	}
	switch {
	case v.IsNone():
		b.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case v.IsInt():
		b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		b.WriteString(pyFloatRepr(v.AsFloat(), true))
	case v.IsString():
		writeJSONString(b, v.AsString(), o.ensureASCII)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, item := range items {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			writeNewlineIndent(b, o, depth+1)
			if err := encodeJSON(b, item, o, depth+1); err != nil {
				return err
			}
		}
		writeNewlineIndent(b, o, depth)
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = slices.Clone(keys)
			slices.Sort(keys) // Python sorts str keys by code point: UTF-8 byte order agrees.
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			writeNewlineIndent(b, o, depth+1)
			writeJSONString(b, k, o.ensureASCII)
			b.WriteString(o.keySep)
			if err := encodeJSON(b, d.Data[k], o, depth+1); err != nil {
				return err
			}
		}
		writeNewlineIndent(b, o, depth)
		b.WriteByte('}')
	case v.IsUndefined():
		return errors.New("object of type Undefined is not JSON serializable")
	default:
		return fmt.Errorf("object %s is not JSON serializable", v)
	}
	return nil
}

func writeNewlineIndent(b *strings.Builder, o *jsonOptions, depth int) {
	if !o.indented {
		return
	}
	b.WriteByte('\n')
	for range depth {
		b.WriteString(o.indent)
	}
}

const hexDigits = "0123456789abcdef"

// writeJSONString quotes s as Python's json encoder does: only '"', '\\' and C0 controls are
// escaped (\n \r \t \b \f by name, the rest as \u00xx); with ensureASCII, everything outside
// ' '..'~' is escaped too (UTF-16 surrogate pairs above U+FFFF).
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < 0x7f {
			i++
			continue
		}
		if c >= 0x7f && !ensureASCII {
			i++
			continue
		}
		b.WriteString(s[start:i])
		size := 1
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			r := rune(c)
			if c >= 0x80 {
				r, size = utf8.DecodeRuneInString(s[i:])
			}
			if r > 0xffff {
				r -= 0x10000
				writeU4(b, 0xd800+(r>>10))
				writeU4(b, 0xdc00+(r&0x3ff))
			} else {
				writeU4(b, r)
			}
		}
		i += size
		start = i
	}
	b.WriteString(s[start:])
	b.WriteByte('"')
}

func writeU4(b *strings.Builder, r rune) {
	b.WriteString(`\u`)
	for shift := 12; shift >= 0; shift -= 4 {
		b.WriteByte(hexDigits[(r>>shift)&0xf])
	}
}

// pyFloatRepr formats f as Python's repr(float) (and so json.dumps) does: the shortest digits that
// round-trip, in fixed notation with at least one decimal when 1e-4 <= |f| < 1e16, else as
// d.ddde±XX. json spells the non-finite values NaN/Infinity; str() spells them nan/inf.
func pyFloatRepr(f float64, json bool) string {
	switch {
	case math.IsNaN(f) && json:
		return "NaN"
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 0):
		s := "inf"
		if json {
			s = "Infinity"
		}
		if f < 0 {
			s = "-" + s
		}
		return s
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d[.ddd]e±XX, exponent of at least two digits
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if decpt := exp + 1; decpt > -4 && decpt <= 16 {
		s := strconv.FormatFloat(f, 'f', -1, 64)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
		return s
	}
	return e
}
