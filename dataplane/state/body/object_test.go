package body

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := map[string]struct {
		in      string
		keys    []string
		wantErr error
	}{
		"empty object":      {in: `{}`, keys: nil},
		"whitespace":        {in: " \n{ \"a\" : 1 ,\t\"b\":[1, {\"c\":\"}\"}] } ", keys: []string{"a", "b"}},
		"escaped key":       {in: `{"a\"b":1,"\u00e9":2}`, keys: []string{`a"b`, "é"}},
		"escaped quotes":    {in: `{"s":"x\\\"y\\\\","t":true}`, keys: []string{"s", "t"}},
		"duplicate key":     {in: `{"a":1,"b":2,"a":3}`, keys: []string{"a", "b"}},
		"nested strings":    {in: `{"m":[{"content":"]}{["}],"n":null}`, keys: []string{"m", "n"}},
		"invalid json":      {in: `{"a":}`, wantErr: ErrInvalidJSON},
		"truncated":         {in: `{"a":1`, wantErr: ErrInvalidJSON},
		"null":              {in: `null`, wantErr: ErrNotObject},
		"array":             {in: `[1,2]`, wantErr: ErrNotObject},
		"string":            {in: `"x"`, wantErr: ErrNotObject},
		"empty":             {in: ``, wantErr: ErrInvalidJSON},
		"trailing garbage":  {in: `{} x`, wantErr: ErrInvalidJSON},
		"numbers and bools": {in: `{"a":-1.5e3,"b":false,"c":0}`, keys: []string{"a", "b", "c"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, err := Parse([]byte(tc.in))
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, f := range o.Fields() {
				keys = append(keys, f.Key)
			}
			if !reflect.DeepEqual(keys, tc.keys) {
				t.Fatalf("keys = %q, want %q", keys, tc.keys)
			}
			assertSameJSON(t, o.Bytes(), []byte(tc.in))
		})
	}
}

func TestDuplicateKeepsLastValue(t *testing.T) {
	o, err := Parse([]byte(`{"a":1,"b":2,"a":3}`))
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := o.Get("a"); string(v) != "3" {
		t.Fatalf("a = %s, want 3", v)
	}
}

func TestEditAndEncode(t *testing.T) {
	o, err := Parse([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"min_tokens":3}`))
	if err != nil {
		t.Fatal(err)
	}
	c := o.Clone()
	c.Set("stream", json.RawMessage("false"))
	c.Delete("min_tokens")
	c.Set("max_tokens", json.RawMessage("1"))
	c.Set("kv_transfer_params", json.RawMessage(`{"do_remote_decode":true}`))
	want := `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false,"max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`
	if got := string(c.Bytes()); got != want {
		t.Fatalf("clone = %s\nwant    %s", got, want)
	}
	if got := string(o.Bytes()); !strings.Contains(got, `"min_tokens":3`) || !strings.Contains(got, `"stream":true`) {
		t.Fatalf("original modified: %s", got)
	}
	bufs, n := c.Buffers()
	b, err := io.ReadAll(&bufs)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want || int(n) != len(want) || c.Size() != len(want) {
		t.Fatalf("reader = %s (n=%d size=%d)", b, n, c.Size())
	}
}

func TestBuffersShareValues(t *testing.T) {
	big := strings.Repeat("A", 1<<20)
	o, err := Parse([]byte(`{"messages":"` + big + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(10, func() {
		bufs, _ := o.Buffers()
		_, _ = io.Copy(io.Discard, &bufs)
	})
	if allocs > 6 {
		t.Fatalf("Buffers allocates %v times per use", allocs)
	}
	if n := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			bufs, _ := o.Buffers()
			_, _ = io.Copy(io.Discard, &bufs)
		}
	}).AllocedBytesPerOp(); n > int64(len(big))/16 {
		// A copy of the value is a MiB; what the runtime and the race detector allocate around a
		// few iterations on a loaded machine is a few KiB.
		t.Fatalf("Buffers copies the values: %d B/op", n)
	}
}

func TestTypedAccessors(t *testing.T) {
	o, err := Parse([]byte(`{"s":"x","e":"a\nb","b":true,"i":8,"f":8.0,"g":8.5,"n":null,"o":{"k":1},"a":[1]}`))
	if err != nil {
		t.Fatal(err)
	}
	if s, ok, err := o.String("s"); s != "x" || !ok || err != nil {
		t.Errorf("String(s) = %q %v %v", s, ok, err)
	}
	if s, _, _ := o.String("e"); s != "a\nb" {
		t.Errorf("String(e) = %q", s)
	}
	if _, _, err := o.String("b"); err == nil {
		t.Error("String(b) should fail")
	}
	if b, ok, err := o.Bool("b"); !b || !ok || err != nil {
		t.Errorf("Bool(b) = %v %v %v", b, ok, err)
	}
	if _, ok, err := o.Bool("n"); ok || err != nil {
		t.Errorf("Bool(null) = %v %v", ok, err)
	}
	if _, _, err := o.Bool("s"); err == nil {
		t.Error("Bool(s) should fail")
	}
	for k, want := range map[string]int64{"i": 8, "f": 8} {
		if n, ok, err := o.Int(k); n != want || !ok || err != nil {
			t.Errorf("Int(%s) = %d %v %v", k, n, ok, err)
		}
	}
	if _, _, err := o.Int("g"); err == nil {
		t.Error("Int(8.5) should fail")
	}
	if in, ok, err := o.Object("o"); !ok || err != nil || in.Len() != 1 {
		t.Errorf("Object(o) = %v %v %v", in, ok, err)
	}
	if _, _, err := o.Object("a"); err == nil {
		t.Error("Object(a) should fail")
	}
	kinds := map[string]Kind{"s": KindString, "b": KindBool, "i": KindNumber, "n": KindNull, "o": KindObject, "a": KindArray, "missing": KindNone}
	for k, want := range kinds {
		if got := o.Kind(k); got != want {
			t.Errorf("Kind(%s) = %d, want %d", k, got, want)
		}
	}
}

func TestArray(t *testing.T) {
	items, err := Array([]byte(` [ 1, "a,]", {"x":[2,3]}, [], null ] `))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range items {
		got = append(got, string(it))
	}
	want := []string{`1`, `"a,]"`, `{"x":[2,3]}`, `[]`, `null`}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("items = %q", got)
	}
	if string(AppendArray(nil, items)) != `[1,"a,]",{"x":[2,3]},[],null]` {
		t.Fatalf("AppendArray = %s", AppendArray(nil, items))
	}
	if empty, err := Array([]byte(`[]`)); err != nil || len(empty) != 0 {
		t.Fatalf("empty = %v %v", empty, err)
	}
	if _, err := Array([]byte(`{}`)); err == nil {
		t.Fatal("object accepted as array")
	}
}

func assertSameJSON(t *testing.T, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("re-encoded body is invalid: %v: %s", err, got)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("re-encoded body differs:\n got  %s\n want %s", got, want)
	}
}

func TestSegmentsAndOffset(t *testing.T) {
	raw := []byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}}]}],"n":1}`)
	o, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	msgs, _ := o.Get("messages")
	items, _ := Array(msgs)
	msg, err := ParseNested(items[0])
	if err != nil {
		t.Fatal(err)
	}
	content, _ := msg.Get("content")
	parts, _ := Array(content)
	off := Offset(msgs, parts[0])
	if off < 0 || string(msgs[off:off+len(parts[0])]) != string(parts[0]) || Offset(msgs, []byte("elsewhere")) != -1 {
		t.Fatalf("offset %d", off)
	}
	end := off + len(parts[0]) - 1
	c := o.Clone()
	c.SetSegments("messages", msgs[:end], []byte(`,"uuid":"h"`), msgs[end:])
	want := `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"},"uuid":"h"}]}],"n":1}`
	bufs, n := c.Buffers()
	streamed, _ := io.ReadAll(&bufs)
	if string(c.Bytes()) != want || string(streamed) != want || int(n) != len(want) || c.Size() != len(want) {
		t.Fatalf("bytes %s\nstream %s", c.Bytes(), streamed)
	}
	if got, _ := c.Get("messages"); !strings.Contains(string(got), `"uuid":"h"`) {
		t.Fatalf("Get of a segmented value: %s", got)
	}
	if string(o.Bytes()) != string(raw) {
		t.Fatal("the original object changed")
	}
	part, err := ParseNested(parts[0])
	if err != nil {
		t.Fatal(err)
	}
	inner, _, err := part.Object("image_url")
	if err != nil {
		t.Fatal(err)
	}
	if url, _, _ := inner.String("url"); url != "data:x" {
		t.Fatalf("url %q", url)
	}
}

func TestMembersAndElements(t *testing.T) {
	tests := []struct {
		data    string
		members []string // key=value
		elems   []string
	}{
		{data: ` { "a" : 1 , "b":[1, {"c":"}"}], "k\"q": "v" } `, members: []string{`a=1`, `b=[1, {"c":"}"}]`, `k"q="v"`}},
		{data: `{}`},
		{data: `[ 1 ,"x", {"a":[]} ,null]`, elems: []string{`1`, `"x"`, `{"a":[]}`, `null`}},
		{data: `[]`},
		{data: `"not a container"`},
	}
	for _, tc := range tests {
		var members, elems []string
		for k, v := range Members([]byte(tc.data)) {
			members = append(members, k+"="+string(v))
		}
		for v := range Elements([]byte(tc.data)) {
			elems = append(elems, string(v))
		}
		if fmt.Sprint(members) != fmt.Sprint(tc.members) || fmt.Sprint(elems) != fmt.Sprint(tc.elems) {
			t.Errorf("%s: members %q elements %q; want %q and %q", tc.data, members, elems, tc.members, tc.elems)
		}
	}
	// Stopping early stops the walk.
	n := 0
	for range Members([]byte(`{"a":1,"b":2,"c":3}`)) {
		n++
		break
	}
	if n != 1 {
		t.Fatalf("walked %d members after break", n)
	}
}

func TestObjects(t *testing.T) {
	var got []string
	for o, raw := range Objects([]byte(` [ {"role":"user","content":"a\"}b"} , 7,{"x":{"y":[1]}},"s" ,{}] `)) {
		parsed := "nil"
		if o != nil {
			parsed = string(o.Bytes())
		}
		got = append(got, string(raw)+" -> "+parsed)
	}
	want := []string{`{"role":"user","content":"a\"}b"} -> {"role":"user","content":"a\"}b"}`, `7 -> nil`,
		`{"x":{"y":[1]}} -> {"x":{"y":[1]}}`, `"s" -> nil`, `{} -> {}`}
	if !slices.Equal(got, want) {
		t.Errorf("Objects yields\n%q\nwant\n%q", got, want)
	}
	n := 0
	for range Objects([]byte(`[{},{},{}]`)) {
		n++
		break
	}
	if n != 1 {
		t.Fatalf("walked %d objects after break", n)
	}
}

func TestAppendString(t *testing.T) {
	tests := map[string]string{
		`""`:                       "",
		`"plain"`:                  "plain",
		`"a\"b\\c\/d\b\f\n\r\t"`:   "a\"b\\c/d\b\f\n\r\t",
		`"\u00e9\u4e2d"`:           "é中",
		`"\ud83d\ude00"`:           "😀",
		`"lone \ud800 high"`:       "lone \uFFFD high",
		`"lone \udc00 low"`:        "lone \uFFFD low",
		`"\ud800\u0041"`:           "\uFFFDA",
		`"multi-byte é stays"`:     "multi-byte é stays",
		"\"bad \xff\\n\xe4\\\"x\"": "bad \uFFFD\n\uFFFD\"x",
		`"\\\""`:                   `\"`,
	}
	for raw, want := range tests {
		got, err := AppendString(nil, []byte(raw))
		if err != nil || string(got) != want {
			t.Errorf("AppendString(%s) = %q, %v; want %q", raw, got, err, want)
		}
	}
	for _, bad := range []string{`x`, `"`, `"\`, `"\u12"`, `"\q"`, `"a"b"`} {
		if _, err := AppendString(nil, []byte(bad)); err == nil {
			t.Errorf("AppendString(%s) accepted", bad)
		}
	}
}

func TestDecodeString(t *testing.T) {
	tests := []struct {
		data, want string
		n          int
	}{
		{`"",1`, "", 2},
		{`"a\"b" : 2`, `a"b`, 6},
		{`"\\"]`, `\`, 4},
		{`"x\\\""}`, `x\"`, 7},
		{`"\n\n\n" "next"`, "\n\n\n", 8},
		{"\"\xff\\t\"", "\uFFFD\t", 5},
	}
	for _, tt := range tests {
		got, n, err := DecodeString([]byte("p:"), []byte(tt.data))
		if err != nil || string(got) != "p:"+tt.want || n != tt.n {
			t.Errorf("DecodeString(%s) = %q, %d, %v; want %q, %d", tt.data, got, n, err, "p:"+tt.want, tt.n)
		}
	}
	for _, bad := range []string{``, `x"`, `"open`, `"a\"`, `"\`, `"\u00"`, `"\x"`} {
		if _, _, err := DecodeString(nil, []byte(bad)); err == nil {
			t.Errorf("DecodeString(%s) accepted", bad)
		}
	}
}

// BenchmarkUnescape decodes the inside of JSON strings as clients send them: prose with a few
// escapes, code with many (quotes and new lines), and text with none.
func BenchmarkUnescape(b *testing.B) {
	texts := map[string]string{
		"prose": strings.Repeat("The committee reviewed the quarterly results on Tuesday; the board said it's \"cautiously optimistic\" about the next two quarters.\n\n", 64),
		"code":  strings.Repeat("def handler(request):\n    payload = json.loads(request.body)\n    if not payload.get(\"items\"):\n        return Response(status=400)\n    return {\"count\": len(payload[\"items\"]), \"ok\": True}\n\n", 48),
		"plain": strings.Repeat("自然语言处理是人工智能领域的一个重要方向, and plain prose without a single escape in it. ", 96),
	}
	for _, name := range []string{"prose", "code", "plain"} {
		raw, _ := json.Marshal(texts[name])
		inside := raw[1 : len(raw)-1]
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(inside)))
			var dst []byte
			for range b.N {
				dst, _ = Unescape(dst[:0], inside)
			}
		})
	}
}
