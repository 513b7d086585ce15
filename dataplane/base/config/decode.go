package config

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strings"
)

// decodeInto assigns a generic YAML value (maps, slices, scalars) onto the struct pointed to by
// dst, field by field, using the yaml tags. Keys missing from src keep dst's current values, which
// is how defaults survive. Every error names the full key path, e.g. server.read_timeout.
func decodeInto(dst any, src map[string]any) error {
	return decodeValue(reflect.ValueOf(dst).Elem(), src, "")
}

var durationType = reflect.TypeOf(Duration(0))

func decodeValue(v reflect.Value, src any, path string) error {
	if v.Type() == durationType {
		s, ok := src.(string)
		if !ok {
			if n, isInt := asInt(src); isInt && n == 0 {
				v.SetInt(0)
				return nil
			}
			return fieldErr(path, "must be a duration string with a unit (e.g. 30s), got %s", describe(src))
		}
		d, err := ParseDuration(s)
		if err != nil {
			return fieldErr(path, "%v", err)
		}
		v.SetInt(int64(d))
		return nil
	}
	switch v.Kind() {
	case reflect.Pointer: // an optional block (canary): null removes it, a mapping sets it over its defaults
		if src == nil {
			v.Set(reflect.Zero(v.Type()))
			return nil
		}
		if v.IsNil() {
			v.Set(newBlock(v.Type()))
		}
		return decodeValue(v.Elem(), src, path)
	case reflect.Struct:
		m, ok := src.(map[string]any)
		if !ok {
			return fieldErr(path, "must be a mapping, got %s", describe(src))
		}
		fields := structFields(v.Type())
		for _, k := range sortedKeys(m) {
			idx, known := fields[k]
			if !known {
				return fieldErr(join(path, k), "unknown key (known keys: %s)", strings.Join(knownKeys(fields), ", "))
			}
			if err := decodeValue(v.Field(idx), m[k], join(path, k)); err != nil {
				return err
			}
		}
		return nil
	case reflect.String:
		s, ok := src.(string)
		if !ok {
			return fieldErr(path, "must be a string, got %s", describe(src))
		}
		v.SetString(s)
	case reflect.Bool:
		b, ok := src.(bool)
		if !ok {
			return fieldErr(path, "must be a boolean, got %s", describe(src))
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int64:
		n, ok := asInt(src)
		if !ok {
			return fieldErr(path, "must be an integer, got %s", describe(src))
		}
		v.SetInt(n)
	case reflect.Float64:
		switch n := src.(type) {
		case float64:
			v.SetFloat(n)
		default:
			i, ok := asInt(src)
			if !ok {
				return fieldErr(path, "must be a number, got %s", describe(src))
			}
			v.SetFloat(float64(i))
		}
	case reflect.Slice:
		if src == nil {
			v.Set(reflect.Zero(v.Type()))
			return nil
		}
		items, ok := src.([]any)
		if !ok {
			return fieldErr(path, "must be a list, got %s", describe(src))
		}
		out := reflect.MakeSlice(v.Type(), len(items), len(items))
		for i, item := range items {
			if err := decodeValue(out.Index(i), item, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		v.Set(out)
	case reflect.Map: // map[string]any: step params, kept generic
		if src == nil {
			v.Set(reflect.Zero(v.Type()))
			return nil
		}
		m, ok := src.(map[string]any)
		if !ok {
			return fieldErr(path, "must be a mapping, got %s", describe(src))
		}
		v.Set(reflect.ValueOf(m))
	default:
		return fieldErr(path, "unsupported field kind %s", v.Kind())
	}
	return nil
}

// newBlock is a new optional block of pointer type t, with its defaults.
func newBlock(t reflect.Type) reflect.Value {
	if t == reflect.TypeOf((*Canary)(nil)) {
		return reflect.ValueOf(NewCanary())
	}
	if t == reflect.TypeOf((*RateLimit)(nil)) {
		return reflect.ValueOf(newRateLimit())
	}
	return reflect.New(t.Elem())
}

// asInt accepts the integer forms YAML and JSON decoders produce, including integral floats.
func asInt(src any) (int64, bool) {
	switch n := src.(type) {
	case int:
		return int64(n), true
	case int64:
		return n, true
	case uint64:
		if n <= math.MaxInt64 {
			return int64(n), true
		}
	case float64:
		if n == math.Trunc(n) && n >= math.MinInt64 && n <= math.MaxInt64 {
			return int64(n), true
		}
	}
	return 0, false
}

// structFields maps yaml key -> field index.
func structFields(t reflect.Type) map[string]int {
	out := make(map[string]int, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		if key := yamlKey(t.Field(i)); key != "" {
			out[key] = i
		}
	}
	return out
}

func yamlKey(f reflect.StructField) string {
	tag := f.Tag.Get("yaml")
	if tag == "-" || !f.IsExported() {
		return ""
	}
	name, _, _ := strings.Cut(tag, ",")
	if name == "" {
		name = strings.ToLower(f.Name)
	}
	return name
}

func knownKeys(fields map[string]int) []string {
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// describe names a generic value's type for error messages.
func describe(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("string %q", x)
	case bool:
		return fmt.Sprintf("boolean %v", x)
	case int, int64, uint64:
		return fmt.Sprintf("integer %v", x)
	case float64:
		return fmt.Sprintf("number %v", x)
	case []any:
		return "a list"
	case map[string]any:
		return "a mapping"
	}
	return fmt.Sprintf("%T", v)
}
