package steps

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
)

// newMediaStep builds the replace-media-urls step from params; allowLoopback exempts loopback
// addresses (any port) from the guard, as the integration stack does.
func newMediaStep(t testing.TB, own map[string]any, allowLoopback bool) pipeline.Step {
	t.Helper()
	deps := builder.Deps{Log: logr.Discard()}
	if allowLoopback {
		deps.Overrides.MediaAllowAddr = netip.Addr.IsLoopback
	}
	p := params.New("params", own, nil)
	s, err := newReplaceMediaURLs(deps, p)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.(pipeline.Closer).Close)
	return s
}

func chatWithImages(urls ...string) string {
	parts := make([]string, len(urls))
	for i, u := range urls {
		parts[i] = fmt.Sprintf(`{"type":"image_url","image_url":{"url":%q,"detail":"low"}}`, u)
	}
	return chatWithParts(parts...)
}

// chatWithParts puts the parts at messages[1].content[1...], after a text part.
func chatWithParts(parts ...string) string {
	return `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"look"}` +
		strings.Repeat(",", min(len(parts), 1)) + strings.Join(parts, ",") + `]}]}`
}

// Only conversational requests carry media; the others pass untouched.
func TestReplaceMediaURLsSkips(t *testing.T) {
	s := newMediaStep(t, nil, false)
	for path, b := range map[string]string{
		"/v1/completions":        `{"prompt":"http://127.0.0.1/x.png"}`,
		"/inference/v1/generate": `{"token_ids":[1]}`,
		"/v1/chat/completions":   `{"messages":[{"role":"user","content":"http://127.0.0.1/x.png"},{"role":"user","content":[{"type":"text","text":"t"}]}]}`,
	} {
		rc, _ := newRC(t, path, b, nil)
		before := string(rc.Body.Bytes())
		if err := s.Execute(t.Context(), rc); err != nil || len(rc.Media) != 0 || string(rc.Body.Bytes()) != before {
			t.Fatalf("%s: err=%v media=%v", path, err, rc.Media)
		}
	}
}

// The step holds its requests' media in the process's budget (builder.Shared.Media): an inlined
// body counts there until its request ends.
func TestReplaceMediaURLsUsesTheProcessBudget(t *testing.T) {
	shared := &budget.Bytes{}
	p := params.New("params", nil, nil)
	s, err := newReplaceMediaURLs(builder.Deps{Log: logr.Discard(), Shared: builder.Shared{Media: shared}}, p)
	if err != nil || p.Err() != nil {
		t.Fatal(err, p.Err())
	}
	ctx, end := context.WithCancel(t.Context())
	defer end()
	rc, _ := newRC(t, "/v1/chat/completions", chatWithParts(`{"type":"image_url","image_url":"data:image/png;base64,iVBORw0KGgo="}`), nil)
	if err := s.Execute(ctx, rc); err != nil {
		t.Fatal(err)
	}
	raw, _ := rc.Body.Get("messages")
	if got := shared.Held(); got != int64(len(raw)) {
		t.Fatalf("the process budget holds %d bytes, want the inlined messages' %d", got, len(raw))
	}
}
