package chattemplate

import (
	"strconv"
	"strings"
	"unicode"

	"github.com/epd-dev/coordinator/dataplane/render/jinja"
)

// pyIsSpace is Python's str.isspace for one character: Go's unicode.IsSpace plus the four
// information separators U+001C..U+001F.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}

// pyStrip is Python's s.strip() (chars == nil) or s.strip(chars).
func pyStrip(s string, chars *string) string {
	if chars != nil {
		return strings.Trim(s, *chars)
	}
	return strings.TrimFunc(s, pyIsSpace)
}

// pyStr is Python's str() of a template value, as Jinja2's filters apply it to their input.
func pyStr(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return ""
	case v.IsNone():
		return "None"
	case v.IsBool():
		if v.AsBool() {
			return "True"
		}
		return "False"
	case v.IsInt():
		return strconv.FormatInt(v.AsInt(), 10)
	case v.IsFloat():
		return pyFloatRepr(v.AsFloat(), false)
	case v.IsString():
		return v.AsString()
	}
	return v.String()
}

// filterTrim is Jinja2's trim filter: str(value).strip(chars).
func filterTrim(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	chars, ok := kwargs["chars"]
	if !ok && len(args) > 1 {
		chars, ok = args[1], true
	}
	if ok && !chars.IsNone() && !chars.IsUndefined() {
		c := pyStr(chars)
		return jinja.NewString(pyStrip(pyStr(args[0]), &c)), nil
	}
	return jinja.NewString(pyStrip(pyStr(args[0]), nil)), nil
}
