package body

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func TestValidAgreesWithEncodingJSON(t *testing.T) {
	cases := []string{
		``, ` `, `{}`, `[]`, `""`, `"a"`, `0`, `-0`, `01`, `-`, `1.`, `1.5`, `1e5`, `1E+5`, `1e`, `.5`, `-1.2e-3`,
		`true`, `tru`, `false`, `null`, `nul`, `{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `[1,2,]`, `[1 2]`,
		`"\u00e9"`, `"\u00g9"`, `"\x"`, `"\/"`, `"a` + "\n" + `b"`, `"tab	here"`, "\"\x1f\"", "\"\x7f\"", `"\"`,
		`{"a":[{"b":"c"}],"d":{"e":null}}`, ` {} `, `{} {}`, `[`, `]`, `"abcdefghijklmnopqrstuvwxyz\"quoted\" \\ end"`,
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001), strings.Repeat("[", 9999) + strings.Repeat("]", 9999),
		`"` + strings.Repeat("x", 100) + "\x01" + `"`, "\"\xff\xfe invalid utf8 is accepted by encoding/json\"",
	}
	for _, c := range cases {
		if got, want := Valid([]byte(c)), json.Valid([]byte(c)); got != want {
			t.Errorf("Valid(%.40q) = %v, encoding/json says %v", c, got, want)
		}
	}
}

func FuzzValid(f *testing.F) {
	for _, s := range []string{`{"a":"b\\n\"c\u0041"}`, `[1,-2.5e3,true,null]`, "\"\x00\"", `{"k":[{}]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if got, want := Valid([]byte(in)), json.Valid([]byte(in)); got != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", in, got, want)
		}
	})
}

func imageBody() []byte {
	img := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xff, 0xd8, 0x42}, (1<<20)/4))
	return []byte(fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,%s"}}]}]}`, img))
}

func BenchmarkValid(b *testing.B) {
	body := imageBody()
	b.Run("body.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for i := 0; i < b.N; i++ {
			Valid(body)
		}
	})
	b.Run("encoding/json.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		for i := 0; i < b.N; i++ {
			json.Valid(body)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	for name, body := range map[string][]byte{
		"1MiB-image": imageBody(),
		// A worker's small answer: many short strings (keys, values), none long.
		"200B-answer": []byte(`{"id":"d","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}`),
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := Parse(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestValidLongStrings puts each special byte at every position of strings long enough to go
// through the word-at-a-time paths, and compares with encoding/json.
func TestValidLongStrings(t *testing.T) {
	for _, special := range []string{`"`, `\"`, `\\`, `\n`, `\u0041`, `\x`, "\x01", "\x1f", "\n", "\t", `\`, "\x7f", "é"} {
		for n := 0; n < 80; n++ {
			s := `"` + strings.Repeat("a", n) + special + strings.Repeat("b", 80-n) + `"`
			for _, doc := range []string{s, `{"k":` + s + `}`, `[` + s + `,1]`} {
				if got, want := Valid([]byte(doc)), json.Valid([]byte(doc)); got != want {
					t.Fatalf("Valid(%q) = %v, encoding/json says %v", doc, got, want)
				}
			}
		}
	}
}

// BenchmarkObjects parses each message of a 600-message conversation (as the render step's
// passes over the messages do): what a nested object's room costs.
func BenchmarkObjects(b *testing.B) {
	var msgs strings.Builder
	msgs.WriteByte('[')
	for i := range 600 {
		if i > 0 {
			msgs.WriteByte(',')
		}
		fmt.Fprintf(&msgs, `{"role":"user","content":"message %d: a short step of an agent's work\n"}`, i)
	}
	msgs.WriteByte(']')
	data := []byte(msgs.String())
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		for o := range Objects(data) {
			n += o.Len()
		}
		if n != 1200 {
			b.Fatalf("%d members, want 1200", n)
		}
	}
}
