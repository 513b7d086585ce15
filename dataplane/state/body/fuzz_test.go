package body

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// Fuzz targets of the request body parser; their seed corpora are in testdata/fuzz/<target>/ and
// run with every go test (make fuzz explores further). The reference is encoding/json: whatever
// Parse accepts, the worker (which decodes with a standard JSON parser) must see the same document.

// seedBodies are request bodies of every API plus JSON corner cases.
var seedBodies = []string{
	`{}`,
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":8}`,
	`{"model":"m","prompt":"once upon","max_tokens":8.0,"stream_options":{"include_usage":true}}`,
	`{"model":"m","token_ids":[1,2,3],"sampling_params":{"temperature":0.5}}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="}}]}]}`,
	" \n{ \"a\" : 1 ,\t\"b\":[1, {\"c\":\"}\"}] } ",
	`{"a\"b":1,"\u00e9":2,"a":3,"a":4}`,
	`{"s":"x\\\"y\\\\","e":"\u0000\ud83d\ude00","n":null,"t":true,"f":false,"i":-0,"g":1e-7}`,
	`{"model":"a","mod\u0065l":"b"}`,
	"{\"k\xff\":\"v\xfe\"}",
	`[1,2]`, `"x"`, `null`, `{"a":}`, `{"a":1`, `{} x`,
}

// decodeJSON is what a standard decoder makes of b.
func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("encoding/json rejects %q: %v", b, err)
	}
	return v
}

// jsonKey is k as a standard decoder reads it back once encoded (invalid UTF-8 becomes U+FFFD).
func jsonKey(k string) string {
	b, _ := json.Marshal(k)
	var s string
	_ = json.Unmarshal(b, &s)
	return s
}

// validKeys reports whether every member name of o is valid UTF-8 (and so means the same to Parse
// and to encoding/json, which replaces invalid bytes: two names Parse tells apart may then merge).
func validKeys(o *Object) bool {
	for _, f := range o.fields {
		if !utf8.ValidString(f.Key) {
			return false
		}
	}
	return true
}

// FuzzParse: Parse agrees with encoding/json on what is a JSON object and on its members, every
// accessor agrees with encoding/json on each member, and the object re-encodes to the same
// document.
func FuzzParse(f *testing.F) {
	for _, s := range seedBodies {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := Parse(data)
		switch {
		case !json.Valid(data):
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("Parse(%q) = %v, want ErrInvalidJSON", data, err)
			}
			return
		case KindOf(bytes.TrimLeft(data, " \t\r\n")) != KindObject:
			if !errors.Is(err, ErrNotObject) {
				t.Fatalf("Parse(%q) = %v, want ErrNotObject", data, err)
			}
			return
		case err != nil:
			t.Fatalf("Parse(%q): %v", data, err)
		}
		checkObject(t, o, data, 0)
	})
}

// checkObject checks o, parsed from data, against encoding/json.
func checkObject(t *testing.T, o *Object, data []byte, depth int) {
	t.Helper()
	want, _ := decodeJSON(t, data).(map[string]any)
	if want == nil {
		t.Fatalf("%q: not an object for encoding/json", data)
	}
	out := o.Bytes()
	if !json.Valid(out) {
		t.Fatalf("Bytes() of %q is not JSON: %q", data, out)
	}
	if o.Size() != len(out) {
		t.Fatalf("Size() = %d, Bytes() has %d", o.Size(), len(out))
	}
	bufs, n := o.Buffers()
	if joined, _ := io.ReadAll(&bufs); !bytes.Equal(joined, out) || int(n) != len(out) {
		t.Fatalf("Buffers() = %q (%d), Bytes() = %q", joined, n, out)
	}
	if !validKeys(o) {
		return // see validKeys: the member checks below assume one meaning per name
	}
	if got := decodeJSON(t, out); !reflect.DeepEqual(got, any(want)) {
		t.Fatalf("re-encoding changed the document:\n in  %q\n out %q", data, out)
	}
	if o.Len() != len(want) {
		t.Fatalf("%d members, encoding/json sees %d in %q", o.Len(), len(want), data)
	}
	for _, fl := range o.Fields() {
		k := fl.Key
		raw, ok := o.Get(k)
		if !ok || !o.Has(k) || !bytes.Equal(raw, fl.Value) {
			t.Fatalf("Get(%q) = %q, %v; field %q", k, raw, ok, fl.Value)
		}
		if got := decodeJSON(t, raw); !reflect.DeepEqual(got, want[k]) {
			t.Fatalf("member %q = %q, encoding/json has %v", k, raw, want[k])
		}
		kind := KindOf(raw)
		if o.Kind(k) != kind {
			t.Fatalf("Kind(%q) = %v, KindOf = %v", k, o.Kind(k), kind)
		}
		checkAccessors(t, o, k, raw, kind, depth)
	}
	c := o.Clone()
	for _, fl := range o.Fields() {
		c.Delete(fl.Key)
		if c.Has(fl.Key) {
			t.Fatalf("Delete(%q) kept it", fl.Key)
		}
	}
	if c.Len() != 0 || string(c.Bytes()) != "{}" || !bytes.Equal(o.Bytes(), out) {
		t.Fatalf("deleting every member of a clone: %q, original now %q", c.Bytes(), o.Bytes())
	}
}

func checkAccessors(t *testing.T, o *Object, k string, raw []byte, kind Kind, depth int) {
	t.Helper()
	s, present, err := o.String(k)
	switch {
	case kind == KindNull:
		if present || err != nil {
			t.Fatalf("String(%q) of null: %v %v", k, present, err)
		}
	case kind != KindString:
		if !present || err == nil {
			t.Fatalf("String(%q) of %q: %v %v, want an error", k, raw, present, err)
		}
	case err != nil || !present:
		t.Fatalf("String(%q) of %q: %v %v", k, raw, present, err)
	case utf8.Valid(raw):
		// Strings without escapes are the raw bytes (not U+FFFD-replaced like encoding/json's).
		var want string
		_ = json.Unmarshal(raw, &want)
		if s != want {
			t.Fatalf("String(%q) = %q, encoding/json %q", k, s, want)
		}
	}
	b, present, err := o.Bool(k)
	switch {
	case kind == KindNull:
		if present || err != nil {
			t.Fatalf("Bool(%q) of null: %v %v", k, present, err)
		}
	case kind == KindBool:
		if err != nil || b != (string(raw) == "true") {
			t.Fatalf("Bool(%q) of %q = %v %v", k, raw, b, err)
		}
	case err == nil:
		t.Fatalf("Bool(%q) of %q: no error", k, raw)
	}
	n, present, err := o.Int(k)
	switch {
	case kind == KindNull:
		if present || err != nil {
			t.Fatalf("Int(%q) of null: %v %v", k, present, err)
		}
	case kind != KindNumber:
		if err == nil {
			t.Fatalf("Int(%q) of %q: no error", k, raw)
		}
	case err == nil:
		if f, ferr := strconv.ParseFloat(string(raw), 64); ferr != nil || float64(n) != f {
			t.Fatalf("Int(%q) of %q = %d, the number is %v", k, raw, n, f)
		}
	}
	nested, present, err := o.Object(k)
	switch {
	case kind == KindNull:
		if present || err != nil || nested != nil {
			t.Fatalf("Object(%q) of null: %v %v", k, present, err)
		}
	case kind != KindObject:
		if err == nil {
			t.Fatalf("Object(%q) of %q: no error", k, raw)
		}
	case err != nil:
		t.Fatalf("Object(%q) of %q: %v", k, raw, err)
	case depth < 4:
		checkObject(t, nested, raw, depth+1)
	}
	items, err := Array(raw)
	if kind != KindArray {
		if err == nil {
			t.Fatalf("Array of %q: no error", raw)
		}
		return
	}
	checkArray(t, raw, items, err)
}

// checkArray checks Array's split of raw against encoding/json's.
func checkArray(t *testing.T, raw []byte, items []json.RawMessage, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("Array(%q): %v", raw, err)
	}
	var want []json.RawMessage
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if len(items) != len(want) {
		t.Fatalf("Array(%q): %d items, encoding/json %d", raw, len(items), len(want))
	}
	for i := range items {
		if !bytes.Equal(items[i], want[i]) {
			t.Fatalf("Array(%q)[%d] = %q, encoding/json %q", raw, i, items[i], want[i])
		}
		if off := Offset(raw, items[i]); off < 0 || !bytes.Equal(raw[off:off+len(items[i])], items[i]) {
			t.Fatalf("Offset of item %d = %d", i, off)
		}
	}
	joined := AppendArray(nil, items)
	if !reflect.DeepEqual(decodeJSON(t, joined), decodeJSON(t, raw)) {
		t.Fatalf("AppendArray(Array(%q)) = %q", raw, joined)
	}
}

// FuzzArray: Array splits any (validated) JSON array like encoding/json and refuses any other
// value.
func FuzzArray(f *testing.F) {
	for _, s := range []string{`[]`, ` [ 1 , "a" , [ ] , { } , null ] `, `[{"a":"]"},"\"]",[[[]]]]`, `[-1.5e+3,true,false]`, `{}`, `"["`, `1`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !Valid(data) {
			return // Array's input is always a value of a parsed body (validated)
		}
		items, err := Array(data)
		if KindOf(bytes.TrimLeft(data, " \t\r\n")) != KindArray {
			if err == nil {
				t.Fatalf("Array(%q) of a non-array: no error", data)
			}
			return
		}
		checkArray(t, bytes.TrimSpace(data), items, err)
	})
}

// FuzzSetRoundTrip: Set, SetSegments and Delete edit one member of a parsed body and keep every
// other member as it was; the result is JSON encoding/json accepts, whatever the key.
func FuzzSetRoundTrip(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[],"stream":true}`), "stream", []byte(`false`), uint16(1), uint16(3))
	f.Add([]byte(`{"model":"m","prompt":"p"}`), "kv_transfer_params", []byte(`{"do_remote_decode":true}`), uint16(5), uint16(9))
	f.Add([]byte(`{"a":1,"a":2}`), "a", []byte(`[1,2,3]`), uint16(0), uint16(0))
	f.Add([]byte(`{}`), "quote\"key\\ <&> é \x01", []byte(`"v"`), uint16(1), uint16(2))
	f.Add([]byte(`{"k":1}`), "k\xff", []byte(` "spaced" `), uint16(2), uint16(1))
	f.Fuzz(func(t *testing.T, data []byte, key string, value []byte, cut1, cut2 uint16) {
		o, err := Parse(data)
		if err != nil || !json.Valid(value) || !validKeys(o) {
			return
		}
		before := o.Bytes()
		orig, _ := decodeJSON(t, before).(map[string]any)
		jk := jsonKey(key)
		if !utf8.ValidString(key) {
			for _, fl := range o.fields {
				if jsonKey(fl.Key) == jk && fl.Key != key {
					return // two names that encoding/json merges (see validKeys)
				}
			}
		}
		wantValue := decodeJSON(t, value)

		set := o.Clone()
		set.Set(key, value)
		out := set.Bytes()
		got, _ := decodeJSON(t, out).(map[string]any)
		if !reflect.DeepEqual(got[jk], wantValue) {
			t.Fatalf("Set(%q, %q) on %q: %q", key, value, data, out)
		}
		for k, v := range orig {
			if k != jk && !reflect.DeepEqual(got[k], v) {
				t.Fatalf("Set(%q) changed %q: %q", key, k, out)
			}
		}
		if len(got) != len(orig)+btoi(!hasKey(orig, jk)) {
			t.Fatalf("Set(%q) on %q: %d members, from %d", key, data, len(got), len(orig))
		}

		// The same value in up to three segments encodes the same.
		a, b := int(cut1)%(len(value)+1), int(cut2)%(len(value)+1)
		if a > b {
			a, b = b, a
		}
		seg := o.Clone()
		seg.SetSegments(key, value[:a], value[a:b], value[b:])
		bufs, n := seg.Buffers()
		joined, _ := io.ReadAll(&bufs)
		if segOut := seg.Bytes(); !bytes.Equal(segOut, out) || !bytes.Equal(joined, out) || int(n) != len(out) || seg.Size() != len(out) {
			t.Fatalf("SetSegments: Bytes %q, Buffers %q (%d), Set %q", segOut, joined, n, out)
		}
		if v, ok := seg.Get(key); !ok || !bytes.Equal(v, value) {
			t.Fatalf("Get after SetSegments = %q", v)
		}

		del := set.Clone()
		del.Delete(key)
		gotDel, _ := decodeJSON(t, del.Bytes()).(map[string]any)
		if _, ok := gotDel[jk]; ok {
			t.Fatalf("Delete(%q) kept it: %q", key, del.Bytes())
		}
		for k, v := range orig {
			if k != jk && !reflect.DeepEqual(gotDel[k], v) {
				t.Fatalf("Delete(%q) changed %q: %q", key, k, del.Bytes())
			}
		}
		if !bytes.Equal(o.Bytes(), before) {
			t.Fatalf("editing clones changed the original: %q, was %q", o.Bytes(), before)
		}
	})
}

func hasKey(m map[string]any, k string) bool { _, ok := m[k]; return ok }

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// FuzzMembers: for any input Valid accepts, Members, Elements and Objects yield what encoding/json
// reads (every member in order, every element), and AppendString decodes every string as it does.
func FuzzMembers(f *testing.F) {
	for _, s := range seedBodies {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"s":"\ud800x","t":"\udc00","u":"\ud83d\ude00\u00e9\/\b\f\n\r\t"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if !Valid(data) {
			return
		}
		switch KindOf(bytes.TrimSpace(data)) {
		case KindObject:
			var want map[string]json.RawMessage
			if err := json.Unmarshal(data, &want); err != nil {
				t.Fatalf("encoding/json rejects %q: %v", data, err)
			}
			got := map[string]json.RawMessage{}
			for k, v := range Members(data) {
				got[jsonKey(k)] = v // the last value of a duplicate key, as encoding/json
				checkString(t, v)
			}
			if len(got) != len(want) {
				t.Fatalf("%q: Members yields %d distinct keys, encoding/json %d", data, len(got), len(want))
			}
			for k, v := range want {
				if !bytes.Equal(bytes.TrimSpace(got[k]), bytes.TrimSpace(v)) {
					t.Fatalf("%q: member %q is %s, encoding/json reads %s", data, k, got[k], v)
				}
			}
		case KindArray:
			var want []json.RawMessage
			if err := json.Unmarshal(data, &want); err != nil {
				t.Fatalf("encoding/json rejects %q: %v", data, err)
			}
			n := 0
			for v := range Elements(data) {
				if n >= len(want) || !bytes.Equal(v, bytes.TrimSpace(want[n])) {
					t.Fatalf("%q: element %d is %s", data, n, v)
				}
				checkString(t, v)
				n++
			}
			if n != len(want) {
				t.Fatalf("%q: Elements yields %d, encoding/json %d", data, n, len(want))
			}
			n = 0
			for o, v := range Objects(data) { // the same elements, objects parsed as ParseNested does
				if n >= len(want) || !bytes.Equal(v, bytes.TrimSpace(want[n])) {
					t.Fatalf("%q: Objects' element %d is %s", data, n, v)
				}
				if p, err := ParseNested(v); (o == nil) != (err != nil) || o != nil && !bytes.Equal(o.Bytes(), p.Bytes()) {
					t.Fatalf("%q: Objects' element %d parses to %v, ParseNested to %v (%v)", data, n, o, p, err)
				}
				n++
			}
			if n != len(want) {
				t.Fatalf("%q: Objects yields %d, encoding/json %d", data, n, len(want))
			}
		case KindString:
			checkString(t, bytes.TrimSpace(data))
		}
	})
}

// checkString decodes raw with AppendString when it is a string and compares with encoding/json.
func checkString(t *testing.T, raw []byte) {
	t.Helper()
	if KindOf(raw) != KindString {
		return
	}
	var want string
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatalf("encoding/json rejects %s: %v", raw, err)
	}
	got, err := AppendString([]byte("prefix:"), raw)
	if err != nil || string(got) != "prefix:"+want {
		t.Fatalf("AppendString(%s) = %q, %v; encoding/json decodes %q", raw, got, err, want)
	}
	got, n, err := DecodeString(nil, append(slices.Clip(raw), `,"next"`...))
	if err != nil || string(got) != want || n != len(raw) {
		t.Fatalf("DecodeString(%s...) = %q, %d, %v; encoding/json decodes %q, %d bytes", raw, got, n, err, want, len(raw))
	}
}

// AppendQuote writes what encoding/json decodes back to the same text (invalid UTF-8 as
// U+FFFD), and what it writes for a string without HTML characters is encoding/json's own bytes.
func FuzzAppendQuote(f *testing.F) {
	for _, s := range []string{"", "plain", `a "quoted" \ back`, "tab\tnew\nline\rcr", "\x00\x1f\x7f", "é ☃ 😀",
		"\u2028\u2029", "bad \xff utf-8 \xc3", "<html> & more"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := AppendQuote([]byte("x"), s)[1:]
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("AppendQuote(%q) = %s: not JSON: %v", s, got, err)
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); back != want && !(strings.ContainsRune(s, utf8.RuneError) || !utf8.ValidString(s)) {
			t.Fatalf("AppendQuote(%q) = %s, decodes to %q", s, got, back)
		}
		if !strings.ContainsAny(s, "<>&") {
			want, _ := json.Marshal(s)
			if !bytes.Equal(got, want) {
				t.Fatalf("AppendQuote(%q) = %s, encoding/json writes %s", s, got, want)
			}
		}
	})
}
