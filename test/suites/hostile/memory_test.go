//go:build linux

package hostile

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/doubles/mediaserver"
	"github.com/epd-dev/coordinator/test/harness/stack"
)

// rssBound is the peak resident set the coordinator must stay under through the memory attacks:
// well inside a 1 GiB pod with the default limits.
const rssBound = 512 * mib

// mediaSteps is a pipeline that inlines media from the loopback media server (allowed by network
// and port, as an operator would allow an internal media cache) before decode.
func mediaSteps(media *mediaserver.Server) string {
	u, _ := url.Parse(media.URL())
	return fmt.Sprintf("{type: replace-media-urls, params: {allowed_networks: [127.0.0.1/32], allowed_ports: [%s]}}, {type: decode}", u.Port())
}

func imageURLs(media *mediaserver.Server, n, size int, tag string) []any {
	parts := make([]any, n)
	for i := range parts {
		parts[i] = map[string]any{"type": "image_url", "image_url": map[string]any{"url": fmt.Sprintf("%s/big?bytes=%d&r=%s-%d", media.URL(), size, tag, i)}}
	}
	return parts
}

func TestMediaAmplification(t *testing.T) {
	// The decode worker holds each request for a while, so concurrent requests' media overlap.
	st, err := stack.Start(stack.Options{TTFT: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	media, err := mediaserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = media.Close() })
	co := startCoordinator(t, st.Gateway.URL(), config{steps: mediaSteps(media)})
	stop := ordinary(t, co.url)

	t.Run("300 image URLs are refused before any download", func(t *testing.T) {
		media.Reset()
		r := do(t, http.MethodPost, co.url+"/v1/chat/completions", chatWithParts(imageURLs(media, 300, mib, "many")...), nil)
		if r.status != http.StatusBadRequest {
			t.Fatalf("HTTP %d, want 400: %s", r.status, r.body)
		}
		if e := r.jsonError(t); !strings.Contains(e.Error.Message, "300") {
			t.Errorf("message does not say how many items were sent: %q", e.Error.Message)
		}
		if n := len(media.Requests()); n != 0 {
			t.Errorf("%d downloads for a refused request", n)
		}
	})

	t.Run("media over the per-request total", func(t *testing.T) {
		r := do(t, http.MethodPost, co.url+"/v1/chat/completions", chatWithParts(imageURLs(media, 20, 4*mib, "total")...), nil)
		if r.status != http.StatusBadRequest {
			t.Fatalf("HTTP %d, want 400: %.300s", r.status, r.body)
		}
		if e := r.jsonError(t); !strings.Contains(e.Error.Message, "max_request_media_size") {
			t.Errorf("message does not name the limit: %q", e.Error.Message)
		}
	})

	t.Run("an inline data URL over max_download_size", func(t *testing.T) {
		data := "data:image/jpeg;base64," + base64.StdEncoding.EncodeToString(mediaserver.BigBody(30*mib))
		r := do(t, http.MethodPost, co.url+"/v1/chat/completions",
			chatWithParts(map[string]any{"type": "image_url", "image_url": map[string]any{"url": data}}), nil)
		if r.status != http.StatusBadRequest {
			t.Fatalf("HTTP %d, want 400: %.300s", r.status, r.body)
		}
		if e := r.jsonError(t); !strings.Contains(e.Error.Message, "messages[0].content[1]") || !strings.Contains(e.Error.Message, "max_download_size") {
			t.Errorf("message does not name the part and the limit: %q", e.Error.Message)
		}
	})

	t.Run("concurrent requests over the process budget", func(t *testing.T) {
		// 24 requests of 24 MiB of media each (56 MiB with the inlined body): 1.3 GiB wanted at once
		// of the default 128 MiB budget. Those refused let go at once, so two at a time are served.
		const clients = 24
		statuses := make([]response, clients)
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				statuses[i] = do(t, http.MethodPost, co.url+"/v1/chat/completions", chatWithParts(imageURLs(media, 8, 3*mib, fmt.Sprint("c", i))...), nil)
			})
		}
		wg.Wait()
		counts := map[int]int{}
		for _, r := range statuses {
			counts[r.status]++
			switch r.status {
			case http.StatusOK:
			case http.StatusTooManyRequests, http.StatusServiceUnavailable:
				r.jsonError(t)
				if r.header.Get("Retry-After") == "" {
					t.Errorf("HTTP %d without Retry-After", r.status)
				}
			default:
				t.Errorf("HTTP %d: %.300s", r.status, r.body)
			}
		}
		t.Logf("statuses: %v", counts)
		if counts[http.StatusOK] == 0 || counts[http.StatusOK] == clients {
			t.Errorf("want some requests served and some refused over budget, got %v", counts)
		}
	})

	served, failures := stop()
	if len(failures) > 0 || served == 0 {
		t.Errorf("ordinary requests during the attack: %d served, failures %v", served, failures)
	}
	peak := co.peakRSS(t)
	t.Logf("peak RSS %d MiB (bound %d MiB), %d ordinary requests served meanwhile", peak/mib, rssBound/mib, served)
	if peak > rssBound {
		t.Errorf("peak RSS %d MiB is over %d MiB", peak/mib, rssBound/mib)
	}
}
