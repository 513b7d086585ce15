package bench

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"strings"
)

// Body is one request body of the benchmark, in its non-streaming and streaming forms.
type Body struct {
	// Name identifies the body in reports ("200B", "256KiB-text", "1MiB-image").
	Name string
	// JSON is the non-streaming request; Stream is the same with "stream":true.
	JSON, Stream []byte
}

// Payload returns the streaming or non-streaming form.
func (b Body) Payload(stream bool) []byte {
	if stream {
		return b.Stream
	}
	return b.JSON
}

// Body names, in report order.
const (
	Body200B = "200B"
	Body256K = "256KiB-text"
	Body1MiB = "1MiB-image"
)

// BodyNames lists the benchmark bodies in report order.
var BodyNames = []string{Body200B, Body256K, Body1MiB}

// Bodies returns the three chat bodies of the benchmark, each asking for 16 tokens:
// a 200-byte chat, a 256 KiB text chat and a ~1 MiB chat carrying an inline base64 JPEG data URL.
// Their non-streaming forms are exactly 200, 256 Ki and 1 Mi bytes long.
func Bodies() map[string]Body {
	chat := func(content string) string {
		return `{"model":"sim-model","messages":[{"role":"user","content":"` + content + `"}],"max_tokens":16%s}`
	}
	image := func(b64 string) string {
		return `{"model":"sim-model","messages":[{"role":"user","content":[{"type":"text","text":"describe this image"},` +
			`{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,` + b64 + `"}}]}],"max_tokens":16%s}`
	}
	// Incompressible image bytes behind a JPEG magic.
	rng := rand.New(rand.NewPCG(1, 2))
	raw := make([]byte, 1<<20)
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	copy(raw, []byte{0xff, 0xd8, 0xff, 0xe0})
	return map[string]Body{
		Body200B: sized(Body200B, 200, chat, strings.Repeat("lorem ipsum ", 20), 1),
		Body256K: sized(Body256K, 256<<10, chat, strings.Repeat("lorem ipsum ", 256<<10/12+1), 1),
		Body1MiB: sized(Body1MiB, 1<<20, image, base64.StdEncoding.EncodeToString(raw), 4),
	}
}

// sized builds a body of exactly total bytes (in its non-streaming form) from tmpl, whose content
// is the longest prefix of filler that fits, cut to a multiple of quantum characters; whitespace
// before the closing brace makes up the rest. tmpl's %s is where ,"stream":true goes. The filler
// must need no JSON escaping.
func sized(name string, total int, tmpl func(string) string, filler string, quantum int) Body {
	n := total - len(fmt.Sprintf(tmpl(""), ""))
	n = max(0, min(n, len(filler)))
	n -= n % quantum
	t := tmpl(filler[:n])
	space := strings.Repeat(" ", max(0, total-len(fmt.Sprintf(t, ""))))
	return Body{Name: name, JSON: []byte(fmt.Sprintf(t, space)), Stream: []byte(fmt.Sprintf(t, `,"stream":true`+space))}
}
