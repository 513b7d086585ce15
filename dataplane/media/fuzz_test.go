package media

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// FuzzScanMedia (seeds in testdata/fuzz/FuzzScanMedia) walks arbitrary JSON bodies: the walker must not panic and every media item's
// URL must be the one at its place in the body as a JSON decoder reads it. Then the step runs
// (every dial fails): on success the body it sends on is valid JSON whose media parts are all
// canonical, with data: URLs only.
func FuzzScanMedia(f *testing.F) {
	s := newMediaStep(f, nil, false)
	s.client.Transport = failingTransport{}
	f.Fuzz(func(t *testing.T, raw []byte) {
		obj, err := body.Parse(raw)
		if err != nil {
			return
		}
		items, err := walk(obj, chat)
		if err != nil {
			return
		}
		var doc struct {
			Messages []struct {
				Content []map[string]json.RawMessage `json:"content"`
			} `json:"messages"`
		}
		decoded := json.Unmarshal(raw, &doc) == nil
		for _, it := range items {
			if it.problem != "" || !decoded {
				continue
			}
			p := doc.Messages[it.msg].Content[it.part]
			member := p[it.kind.field]
			var want string
			if json.Unmarshal(member, &want) != nil {
				var inner map[string]json.RawMessage
				_ = json.Unmarshal(member, &inner)
				key := "url"
				if it.kind.dataOnly {
					key = "data"
				}
				if json.Unmarshal(inner[key], &want) != nil {
					t.Fatalf("%s: no URL at its place in %s", it.where(), raw)
				}
			}
			var got string
			if err := json.Unmarshal(it.urlRaw, &got); err != nil || got != want || (utf8.ValidString(it.url) && it.url != want) {
				t.Fatalf("%s: URL %q, the body has %q", it.where(), it.url, want)
			}
		}
		entries, _, err := Scan(obj, chat)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, it := range items {
			if it.problem == "" && it.kind.entry {
				if n >= len(entries) || entries[n].URL != it.url || entries[n].Message != it.msg || entries[n].Part != it.part {
					t.Fatalf("entries %+v do not match the walk", entries)
				}
				n++
			}
		}
		if n != len(entries) {
			t.Fatalf("%d entries, the walk found %d images", len(entries), n)
		}
		rc := newRC(t, string(raw), nil)
		if err := s.Replace(t.Context(), rc, chat); err != nil {
			var e *apierror.Error
			if !errors.As(err, &e) || e.Status >= 500 && e.Status != http.StatusBadGateway {
				t.Fatalf("err = %v", err)
			}
			return
		}
		out := rc.Body.Bytes()
		if !json.Valid(out) {
			t.Fatalf("the body sent on is not JSON: %s", out)
		}
		after, err := walk(mustParse(t, string(out)), chat)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range after {
			if it.problem != "" || !it.canonical || !it.kind.dataOnly && !hasPrefixFold(it.url, "data:") {
				t.Fatalf("%s is sent on as %s (problem %q)", it.where(), it.raw, it.problem)
			}
		}
	})
}

// failingTransport fails every request: the fuzzed step never reaches the network.
type failingTransport struct{}

func (failingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("no network in the fuzz test")
}

// FuzzCheckDataURL (seeds in testdata/fuzz/FuzzCheckDataURL) holds checkDataURL to a real base64 decoder: what it accepts decodes to the
// size it computed and its sniffed head (dataURLHead) is the start of its bytes, and a well-formed data: URL whose payload decodes
// is accepted.
func FuzzCheckDataURL(f *testing.F) {
	mods := []string{modImage, modVideo, modAudio}
	f.Fuzz(func(t *testing.T, u string, kind uint8) {
		types := defaultTypes[mods[int(kind)%len(mods)]]
		mt, size, err := checkDataURL(u, types)
		_, payload, _ := strings.Cut(u, ",")
		decoded, derr := base64.StdEncoding.DecodeString(payload)
		if err == nil {
			if !allowedType(mt, types) || derr != nil || int64(len(decoded)) != size {
				t.Fatalf("accepted %q: type %q size %d, but decoding gives %d bytes, %v", u, mt, size, len(decoded), derr)
			}
			if head := dataURLHead(u); !bytes.Equal(head, decoded[:min(len(decoded), len(head))]) || len(head) < min(len(decoded), sniffLen) {
				t.Fatalf("accepted %q: its sniffed head %x is not the start of its %d bytes", u, head, len(decoded))
			}
			return
		}
		header, _, _ := strings.Cut(u, ",")
		wellFormed := len(header) > 5 && strings.EqualFold(header, "data:"+types[0]+";base64")
		if wellFormed && derr == nil && payload != "" && !strings.ContainsAny(payload, "\r\n") {
			t.Fatalf("refused %q (%v), but it decodes", u, err)
		}
	})
}
