package simworker

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestEncodeKeepsNoRequestMemory checks that the EC descriptor an encode leg
// publishes outlives its request body: strings read from a body share its
// memory, so whatever the worker keeps must be copied.
func TestEncodeKeepsNoRequestMemory(t *testing.T) {
	w := New(Config{Role: RoleEncode, DisableRecording: true})
	img := []byte("retained picture")
	h := ImageHash(img)
	body := mustJSON(t, encodeChatBody(img, h))
	in, err := parseInferenceImages(kindChat, body, imageDigest)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	w.serveEncode(rec, httptest.NewRequest(http.MethodPost, PathChatCompletions, nil), in)
	if rec.Code != http.StatusOK {
		t.Fatalf("encode answered %d: %s", rec.Code, rec.Body)
	}
	copy(body, bytes.Repeat([]byte{'x'}, len(body))) // the buffer is reused for another request
	if _, ok := w.ecDescs.get(h); !ok {
		t.Errorf("descriptor of %s lost when the request body was overwritten", h)
	}
}

// encodeChatBody is the chat encode leg of img whose mm_hash is h.
func encodeChatBody(img []byte, h string) obj {
	return obj{"max_tokens": 1, "messages": []obj{{"role": "user", "content": []obj{imagePart(img)}}},
		"tokens": obj{"token_ids": []int{1, 4}, "features": obj{"mm_hashes": obj{"image": []string{h}}}}}
}
