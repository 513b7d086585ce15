package simworker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unsafe"
)

// A request body is validated and split into members once (parseObject, with the worker's own
// reading of JSON: jsonscan.go).
// The helpers below then read typed values straight from the raw, already
// validated bytes, with the rules encoding/json applies to the Go types the
// worker used to unmarshal into: null (like an absent member) leaves the zero
// value, integers must be integral literals, and members match a field name
// exactly or, failing that, case-insensitively. Strings without escapes
// share the body's memory: they are valid while the request is served
// (clone anything kept longer).

// parseObject validates data and splits the top-level object into members.
// A body that is JSON null decodes as an empty object, as encoding/json does
// for a struct.
func parseObject(data []byte) (*object, error) {
	switch {
	case !validJSON(data):
		var v struct{}
		return nil, json.Unmarshal(data, &v) // encoding/json's wording of the syntax error
	case string(bytes.TrimSpace(data)) == "null":
		return &object{}, nil
	}
	return splitObject(data)
}

// absent reports whether a raw value is missing or null.
func absent(raw []byte) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// member returns the raw value of the member of o that encoding/json would
// decode into a field named name: the last one whose key is name, or equal
// to it under case folding. It returns nil when there is none.
func member(o *object, name string) []byte {
	var v []byte
	for _, f := range o.Fields() {
		if strings.EqualFold(f.Key, name) {
			v = f.Value
		}
	}
	return v
}

// fields reads the members of one JSON object as typed values. The first
// type error is kept in *err; reads after it return zero values.
type fields struct {
	obj  *object // nil when the object is absent: so is every member
	path string  // of the object, for error messages ("" at the top level)
	err  *error
}

// topFields returns the fields of a top-level object, keeping errors in err.
func topFields(o *object, err *error) fields {
	return fields{obj: o, err: err}
}

// raw returns the raw value of member name, or nil when it is absent.
func (f fields) raw(name string) []byte {
	if f.obj == nil || *f.err != nil {
		return nil
	}
	if v := member(f.obj, name); !absent(v) {
		return v
	}
	return nil
}

// at returns the path of member name.
func (f fields) at(name string) string {
	if f.path == "" {
		return name
	}
	return f.path + "." + name
}

// keep records err unless an earlier error is kept.
func (f fields) keep(err error) {
	if err != nil && *f.err == nil {
		*f.err = err
	}
}

// str returns member name as a string.
func (f fields) str(name string) string {
	s, err := jsonString(f.raw(name), f.at(name))
	f.keep(err)
	return s
}

// integer returns member name as an integer, nil when it is absent.
func (f fields) integer(name string) *int {
	n, err := jsonInt(f.raw(name), f.at(name))
	f.keep(err)
	return n
}

// boolean returns member name as a boolean.
func (f fields) boolean(name string) bool {
	b, err := jsonBool(f.raw(name), f.at(name))
	f.keep(err)
	return b
}

// ints returns member name as an array of integers.
func (f fields) ints(name string) []int {
	ids, err := jsonInts(f.raw(name), f.at(name))
	f.keep(err)
	return ids
}

// params returns member name as transfer parameters, nil when it is absent.
func (f fields) params(name string) rawParams {
	o, err := nestedObject(f.raw(name), f.at(name))
	f.keep(err)
	if o == nil {
		return nil
	}
	p := make(rawParams, o.Len())
	for _, m := range o.Fields() {
		p[m.Key] = m.Value
	}
	return p
}

// object returns the fields of member name; their obj is nil when it is
// absent.
func (f fields) object(name string) fields {
	o, err := nestedObject(f.raw(name), f.at(name))
	f.keep(err)
	return fields{obj: o, path: f.at(name), err: f.err}
}

// nestedObject parses raw, a validated object value, or returns nil when it
// is absent.
func nestedObject(raw []byte, path string) (*object, error) {
	if absent(raw) {
		return nil, nil
	}
	if raw[0] != '{' {
		return nil, fmt.Errorf("%s must be an object", path)
	}
	return splitObject(raw)
}

// nestedArray splits raw, a validated array value, into its raw elements, or
// returns nil when it is absent.
func nestedArray(raw []byte, path string) ([]json.RawMessage, error) {
	if absent(raw) {
		return nil, nil
	}
	if raw[0] != '[' {
		return nil, fmt.Errorf("%s must be an array", path)
	}
	return splitArray(raw)
}

// jsonString decodes a validated string value ("" when it is absent).
func jsonString(raw []byte, path string) (string, error) {
	if absent(raw) {
		return "", nil
	}
	if raw[0] != '"' {
		return "", fmt.Errorf("%s must be a string", path)
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return unsafe.String(unsafe.SliceData(raw[1:]), len(raw)-2), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// jsonInt decodes a validated integer value (nil when it is absent).
func jsonInt(raw []byte, path string) (*int, error) {
	if absent(raw) {
		return nil, nil
	}
	n, err := atoi(raw)
	if err != nil {
		return nil, fmt.Errorf("%s must be an integer", path)
	}
	return &n, nil
}

// bytesOf returns the bytes of s without copying them; they must not be
// modified.
func bytesOf(s string) []byte {
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// atoi parses an integer literal, as encoding/json does for an int.
func atoi(b []byte) (int, error) {
	return strconv.Atoi(unsafe.String(unsafe.SliceData(b), len(b)))
}

// jsonBool decodes a validated boolean value (false when it is absent).
func jsonBool(raw []byte, path string) (bool, error) {
	switch {
	case absent(raw), string(raw) == "false":
		return false, nil
	case string(raw) == "true":
		return true, nil
	}
	return false, fmt.Errorf("%s must be a boolean", path)
}

// jsonInts decodes a validated array of integers (nil when it is absent; a
// null element is 0). Token id arrays run to tens of thousands of elements:
// they are scanned in place, not split into raw elements first.
func jsonInts(raw []byte, path string) ([]int, error) {
	if absent(raw) {
		return nil, nil
	}
	if raw[0] != '[' {
		return nil, fmt.Errorf("%s must be an array of integers", path)
	}
	ids := make([]int, 0, bytes.Count(raw, []byte{','})+1)
	for rest := skipSpace(raw[1:]); rest[0] != ']'; {
		end := 0
		for !elementEnd[rest[end]] {
			end++
		}
		n := 0
		if tok := rest[:end]; string(tok) != "null" {
			var err error
			if n, err = atoi(tok); err != nil {
				return nil, fmt.Errorf("%s must be an array of integers", path)
			}
		}
		ids = append(ids, n)
		if rest = skipSpace(rest[end:]); rest[0] == ',' {
			rest = skipSpace(rest[1:])
		}
	}
	return ids, nil
}

// elementEnd marks the bytes that end a number or literal inside an array.
var elementEnd = [256]bool{',': true, ']': true, ' ': true, '\t': true, '\r': true, '\n': true}

// skipSpace returns b without its leading JSON whitespace.
func skipSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	return b
}
