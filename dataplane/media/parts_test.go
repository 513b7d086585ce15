package media

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// TestScanMedia is render's fallback without replace-media-urls: media parts of every modality and
// shape become entries with the client's URLs (an input_audio's data), in document order; refused
// parts do not.
func TestScanMedia(t *testing.T) {
	obj, err := body.Parse([]byte(chatWithParts(
		`{"type":"image_url","image_url":{"url":"http://a/1.png"}}`,
		`{"type":"image_url","image_url":"http://a/2.png"}`,
		`{"type":"input_image","image_url":"http://a/3.png"}`,
		`{"image_url":{"url":"data:image/png;base64,AAAA"}}`,
		`{"type":"video_url","video_url":{"url":"http://a/v.mp4"}}`,
		`{"type":"image_embeds","image_embeds":"AAAA"}`,
		`{"type":"text","text":"x","image_url":"http://a/4.png"}`,
		`{"type":"audio_url","audio_url":"http://a/a.wav"}`,
		`{"type":"input_audio","input_audio":{"data":"BBBB","format":"wav"}}`,
		`{"type":"input_audio","input_audio":{"url":"http://a/b.wav"}}`,
	)))
	if err != nil {
		t.Fatal(err)
	}
	got, msgs, err := Scan(obj, chat)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := obj.Get("messages")
	if split, _ := body.Array(raw); fmt.Sprintf("%q", msgs) != fmt.Sprintf("%q", split) || body.Offset(raw, msgs[len(msgs)-1]) < 0 {
		t.Fatalf("messages split %q, want the body's own %q", msgs, split)
	}
	want := []request.MediaEntry{
		{Message: 1, Part: 1, Kind: "image_url", URL: "http://a/1.png"},
		{Message: 1, Part: 2, Kind: "image_url", URL: "http://a/2.png"},
		{Message: 1, Part: 3, Kind: "image_url", URL: "http://a/3.png"},
		{Message: 1, Part: 4, Kind: "image_url", URL: "data:image/png;base64,AAAA"},
		{Message: 1, Part: 5, Kind: "video_url", URL: "http://a/v.mp4"},
		{Message: 1, Part: 8, Kind: "audio_url", URL: "http://a/a.wav"},
		{Message: 1, Part: 9, Kind: "input_audio", URL: "BBBB"},
	}
	if len(got) != len(want) {
		t.Fatalf("entries %+v", got)
	}
	for i := range want {
		if g := got[i]; g.Message != want[i].Message || g.Part != want[i].Part || g.Kind != want[i].Kind || g.URL != want[i].URL {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if _, _, err := Scan(mustParse(t, `{"messages":[1]}`), chat); err == nil || !strings.Contains(err.Error(), "messages[0] must be an object") {
		t.Fatalf("err = %v", err)
	}
}

// TestMediaPart: encode's leg takes the media member as {"url": ...}, also from a plain string.
func TestMediaPart(t *testing.T) {
	for raw, want := range map[string]string{
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}}`: `{"url":"data:image/png;base64,AAAA","detail":"low"}`,
		`{"type":"image_url","image_url":"data:image/png;base64,AAAA"}`:                        `{"url":"data:image/png;base64,AAAA"}`,
	} {
		obj := mustParse(t, chatWithParts(raw))
		_, msgs, _ := chatMessages(obj, "messages")
		got, err := Part(msgs, &request.MediaEntry{Message: 1, Part: 1, Kind: "image_url"})
		if err != nil || string(got) != want || !json.Valid(got) {
			t.Errorf("%s: %s, %v", raw, got, err)
		}
	}
}

func mustParse(t *testing.T, raw string) *body.Object {
	t.Helper()
	obj, err := body.Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

// TestPartsContent: a message is parsed for media parts only when its content, the last one as a
// parse keeps, is an array; brackets elsewhere (in a string, another member) are not enough.
func TestPartsContent(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want bool
	}{
		{`{"role":"user","content":"plain"}`, false},
		{`{"role":"user","content":"[1] a list [x](y)"}`, false},
		{`{"role":"assistant","content":"x","tool_calls":[{"id":"a"}]}`, false},
		{`{"role":"user","content":[{"type":"text","text":"hi"}]}`, true},
		{`{"role":"user","content" : [ ]}`, true},
		{`{"content":[{"type":"text","text":"a"}],"content":"b"}`, false},
		{`{"content":"b","content":[{"type":"text","text":"a"}]}`, true},
		{`{"role":"user","con\u0074ent":[{"type":"text","text":"a"}]}`, true},
		{`{"role":"user","content":null,"x":[1]}`, false},
		{`{"role":"user","content":"[1] a: [list] after a colon in text"}`, false},
		{"{\"role\":\"user\",\"content\":\t\n\r [{\"type\":\"text\",\"text\":\"a\"}]}", true},
		{`{"role":"user","content":"[x]","content":[]}`, true},
	} {
		if !body.Valid([]byte(c.msg)) {
			t.Fatalf("%s is not valid JSON", c.msg)
		}
		if got := partsContent([]byte(c.msg)); got != c.want {
			t.Errorf("partsContent(%s) = %v, want %v", c.msg, got, c.want)
		}
		// A message whose content is a list has an array value.
		if c.want && !arrayValue([]byte(c.msg)) {
			t.Errorf("arrayValue(%s) = false", c.msg)
		}
	}
	// Brackets in text are not array values: such a message's members are not scanned.
	for msg, want := range map[string]bool{
		`{"role":"user","content":"[1] a list [x](y) payload[\"items\"]"}`: false,
		`{"role":"user","content":"a: [1]"}`:                               true, // text, scanned
		`{"role":"assistant","content":"x","tool_calls":[{"id":"a"}]}`:     true,
	} {
		if got := arrayValue([]byte(msg)); got != want {
			t.Errorf("arrayValue(%s) = %v, want %v", msg, got, want)
		}
	}
}
