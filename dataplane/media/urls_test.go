package media

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
			where, found := RemoteURL([]byte(tc.body))
			if found != (tc.where != "") || where != tc.where {
				t.Fatalf("RemoteURL = %q, %v; want %q", where, found, tc.where)
			}
		})
	}
}

// TestRefuseRemoteMedia: the check of a pipeline without a media guard sees a URL however JSON
// spells it (escaped slashes, an escaped colon, tabs or leading controls Python's urllib drops),
// and skips the scan only where no URL can be.
func TestRefuseRemoteMedia(t *testing.T) {
	tests := map[string]struct {
		body    string
		refused bool
	}{
		"a plain URL":                  {`{"messages":[{"content":[{"type":"image_url","image_url":{"url":"http://169.254.169.254/"}}]}]}`, true},
		"escaped slashes":              {`{"messages":[{"content":[{"type":"image_url","image_url":{"url":"http:\/\/169.254.169.254\/latest"}}]}]}`, true},
		"an escaped colon":             {`{"input":[{"content":[{"type":"input_image","image_url":"http\u003a//169.254.169.254/"}]}]}`, true},
		"escaped slashes as u escapes": {`{"input":[{"content":[{"type":"input_image","image_url":"https:\u002f\u002fx/"}]}]}`, true},
		"a tab in the scheme":          {`{"image_url":"ht\ttp://x/"}`, true},
		"a tab after the colon":        {`{"image_url":"http:\t//x/"}`, true},
		"leading controls":             {`{"image_url":"\u0001 https://x/"}`, true},
		"inline data":                  {`{"messages":[{"content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA//BB=="}}]}]}`, false},
		"a URL in text":                {`{"messages":[{"content":"see https://example.com"}]}`, false},
		"unicode escapes, no URLs":     {`{"messages":[{"content":"\u4f60\u597d"}]}`, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if err := RefuseRemote([]byte(tc.body)); (err != nil) != tc.refused {
				t.Fatalf("refused: %v, want %v", err, tc.refused)
			}
		})
	}
}

func FuzzRemoteURL(f *testing.F) {
	f.Add([]byte(`{"input":[{"type":"input_image","image_url":"http://169.254.169.254/"}]}`))
	f.Add([]byte(`{"a":[{"b":{"url":"data:x"}}],"c":"http://x"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = RemoteURL(data) // never panics, whatever the input
	})
}
