package server

import "testing"

func TestRemoteURL(t *testing.T) {
	tests := map[string]struct {
		body, where string
	}{
		"Responses input_image":   {`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"},{"type":"input_image","image_url":"http://169.254.169.254/"}]}]}`, "input[0].content[1].image_url"},
		"chat-style object":       {`{"messages":[{"content":[{"type":"image_url","image_url":{"url":"HTTPS://internal/x.png"}}]}]}`, "messages[0].content[0].image_url.url"},
		"Messages API url source": {`{"messages":[{"content":[{"type":"image","source":{"type":"url","url":" http://10.0.0.1/a"}}]}]}`, "messages[0].content[0].source.url"},
		"a list of URLs":          {`{"audio_urls":["data:audio/wav;base64,AA==","http://x/a.wav"]}`, "audio_urls[1]"},
		"file_uri":                {`{"file":{"file_uri":"https://x/y.pdf"}}`, "file.file_uri"},
		"inline data is fine":     {`{"input":[{"type":"input_image","image_url":"data:image/png;base64,AAAA"}]}`, ""},
		"URLs in text are fine":   {`{"input":"see http://example.com/x","url_count":3,"urls_seen":["x"]}`, ""},
		"after a sibling object":  {`{"a":{"b":1},"c":[1,{"d":2}],"e":"http://x","image_url":"http://x"}`, "image_url"},
		"truncated JSON":          {`{"image_url":"http://x"`, "image_url"},
		"not an object":           {`["http://x"]`, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			where, found := remoteURL([]byte(tc.body))
			if found != (tc.where != "") || where != tc.where {
				t.Fatalf("remoteURL = %q, %v; want %q", where, found, tc.where)
			}
		})
	}
}

func FuzzRemoteURL(f *testing.F) {
	f.Add([]byte(`{"input":[{"type":"input_image","image_url":"http://169.254.169.254/"}]}`))
	f.Add([]byte(`{"a":[{"b":{"url":"data:x"}}],"c":"http://x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = remoteURL(data) // never panics, whatever the input
	})
}
