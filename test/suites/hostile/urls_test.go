//go:build linux

package hostile

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
)

// metadata is the cloud metadata service every shape tries to reach.
const metadata = "169.254.169.254"

// TestEveryURLShapeIsGuarded sends each content-part shape a client or vLLM accepts with an
// internal URL in it: none reaches a worker, and each is a 400 that names the part without
// telling the client what the host resolved to.
func TestEveryURLShapeIsGuarded(t *testing.T) {
	st := startStack(t)
	rec := startRecorder(t, st.Gateway.URL())
	media, err := mediaserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = media.Close() })
	mu, _ := url.Parse(media.URL())
	co := startCoordinator(t, rec.url, config{steps: "{type: replace-media-urls}, {type: decode}"})
	// An operator allowing an internal media cache still gets every redirect hop checked.
	allowing := startCoordinator(t, rec.url, config{steps: mediaSteps(media)})

	u := "http://" + metadata + "/latest/meta-data/iam/security-credentials/"
	tests := map[string]struct {
		part    any
		coord   *coordinator
		leak    []string // what the message must not say
		mention string   // what it must say
	}{
		"image_url object":           {part: map[string]any{"type": "image_url", "image_url": map[string]any{"url": u}}},
		"image_url string":           {part: map[string]any{"type": "image_url", "image_url": u}},
		"image_url without type":     {part: map[string]any{"image_url": map[string]any{"url": u}}},
		"input_image":                {part: map[string]any{"type": "input_image", "image_url": u}},
		"input_image object":         {part: map[string]any{"type": "input_image", "image_url": map[string]any{"url": u}}},
		"video_url":                  {part: map[string]any{"type": "video_url", "video_url": map[string]any{"url": u}}},
		"audio_url":                  {part: map[string]any{"type": "audio_url", "audio_url": map[string]any{"url": u}}},
		"input_audio with a URL":     {part: map[string]any{"type": "input_audio", "input_audio": map[string]any{"url": u, "format": "wav"}}},
		"file":                       {part: map[string]any{"type": "file", "file": map[string]any{"file_url": u}}},
		"unknown type with a url":    {part: map[string]any{"type": "image_embeds", "image_embeds": map[string]any{"url": u}}},
		"upper-case scheme":          {part: map[string]any{"type": "image_url", "image_url": map[string]any{"url": "HTTP://" + metadata + "/"}}},
		"NAT64":                      {part: imagePart("http://[64:ff9b::a9fe:a9fe]/"), leak: []string{"64:ff9b"}},
		"6to4":                       {part: imagePart("http://[2002:a9fe:a9fe::1]/")},
		"mapped IPv4":                {part: imagePart("http://[::ffff:169.254.169.254]/")},
		"AWS IPv6 metadata":          {part: imagePart("http://[fd00:ec2::254]/")},
		"zoned link-local":           {part: imagePart("http://[fe80::1%25lo]/")},
		"name resolving to loopback": {part: imagePart("http://localhost/x.png"), leak: []string{"127.0.0.1", "::1"}},
		"unresolvable name":          {part: imagePart("http://no-such-host.invalid/x.png"), leak: []string{":53", "lookup"}},
		"a port other than 80, 443":  {part: imagePart("http://example.com:8080/x.png"), mention: "port"},
		"redirect to metadata": {
			part:  imagePart(fmt.Sprintf("%s/redirect?to=%s", media.URL(), url.QueryEscape(u))),
			coord: allowing,
		},
		"redirect to another port": {
			part:  imagePart(fmt.Sprintf("%s/redirect?to=%s", media.URL(), url.QueryEscape("http://127.0.0.1:1/x.png"))),
			coord: allowing, mention: "port",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := co
			if tc.coord != nil {
				c = tc.coord
			}
			rec.taken()
			r := do(t, http.MethodPost, c.url+"/v1/chat/completions", chatWithParts(tc.part), nil)
			if r.status != http.StatusBadRequest {
				t.Fatalf("HTTP %d, want 400: %.300s", r.status, r.body)
			}
			msg := r.jsonError(t).Error.Message
			if !strings.Contains(msg, "messages[0].content[1]") {
				t.Errorf("the message does not name the part: %q", msg)
			}
			for _, leak := range append(tc.leak, metadata, mu.Host) {
				if strings.Contains(msg, leak) {
					t.Errorf("the message tells the client %q: %q", leak, msg)
				}
			}
			if tc.mention != "" && !strings.Contains(msg, tc.mention) {
				t.Errorf("the message does not say %q: %q", tc.mention, msg)
			}
			for _, leg := range rec.taken() {
				t.Errorf("a leg reached the gateway: %s %s %.200s", leg.method, leg.uri, leg.body)
			}
		})
	}

	t.Run("an allowed image is inlined", func(t *testing.T) {
		rec.taken()
		r := do(t, http.MethodPost, allowing.url+"/v1/chat/completions", chatWithParts(imagePart(media.URL()+"/img/cat.png")), nil)
		if r.status != http.StatusOK {
			t.Fatalf("HTTP %d: %s", r.status, r.body)
		}
		legs := rec.taken()
		if len(legs) != 1 || strings.Contains(string(legs[0].body), media.URL()) || !strings.Contains(string(legs[0].body), "data:image/png;base64,") {
			t.Fatalf("want one decode leg with the image inlined, got %d legs", len(legs))
		}
	})
}

func imagePart(u string) map[string]any {
	return map[string]any{"type": "image_url", "image_url": map[string]any{"url": u}}
}
