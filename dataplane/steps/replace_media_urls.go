package steps

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/logging"
	"github.com/epd-dev/coordinator/dataplane/observe"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/request"
	"github.com/epd-dev/coordinator/dataplane/upstream"
)

// ReplaceMediaURLsStep is the type name of the media inlining step.
const ReplaceMediaURLsStep = "replace-media-urls"

func init() { registry.Register(registry.Type{Name: ReplaceMediaURLsStep, New: newReplaceMediaURLs}) }

// replaceMediaURLs downloads the remote media of a chat request (concurrently, bounded, behind
// an SSRF guard) and inlines it as base64 data: URLs, so that render, encode and every worker see
// the same bytes and no worker fetches from the internet. Inline data: URLs are validated. It
// records one media entry per item, in document order.
type replaceMediaURLs struct {
	client     *http.Client
	guard      *netGuard
	maxConc    int
	maxEntries int
	maxBytes   int64
	metrics    *observe.Metrics
}

func newReplaceMediaURLs(deps registry.Deps, p *params.Params) (pipeline.Step, error) {
	s := &replaceMediaURLs{
		maxConc:    p.Int("max_concurrent_downloads", 10, 1),
		maxEntries: p.Int("max_multimodal_entries", 0, 0),
		maxBytes:   int64(p.Int("max_download_size", 10, 1)) << 20,
		metrics:    deps.Telemetry.Metrics,
	}
	timeout := p.Duration("download_timeout", 10*time.Second)
	s.guard = &netGuard{allowPrivate: p.Bool("allow_private_networks", false)}
	for _, d := range p.StringList("allowed_domains") {
		d = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(d), "."))
		if d == "" || strings.ContainsAny(d, "/:* ") {
			p.Fail("allowed_domains", "%q is not a domain name", d)
		}
		s.guard.domains = append(s.guard.domains, d)
	}
	s.guard.allowAddr = deps.Overrides.MediaAllowAddr
	s.client = &http.Client{
		Timeout: timeout,
		// No proxy (upstream.NewTransport): the guard must see the address actually dialled.
		Transport: upstream.NewTransport(upstream.TransportOptions{
			MaxIdleConnsPerHost:   s.maxConc,
			IdleConnTimeout:       30 * time.Second,
			ResponseHeaderTimeout: timeout,
			DialTimeout:           timeout,
			TLSHandshakeTimeout:   timeout,
			Control:               s.guard.control,
		}),
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return &blockedError{errors.New("too many redirects")}
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return &blockedError{fmt.Errorf("redirect to a %q URL", req.URL.Scheme)}
			}
			if err := s.guard.checkHost(req.URL.Hostname()); err != nil {
				return &blockedError{err}
			}
			return nil
		},
	}
	return s, nil
}

func (*replaceMediaURLs) Name() string { return ReplaceMediaURLsStep }

// Close drops pooled connections to media hosts.
var _ pipeline.Closer = (*replaceMediaURLs)(nil)

func (s *replaceMediaURLs) Close() { s.client.CloseIdleConnections() }

func (s *replaceMediaURLs) Execute(ctx context.Context, rc *request.Context) error {
	if rc.API != request.APIChat {
		return nil
	}
	entries, err := scanMedia(rc.Body)
	if err != nil {
		return err
	}
	rc.MediaScanned = true
	if len(entries) == 0 {
		return nil
	}
	if s.maxEntries > 0 && len(entries) > s.maxEntries {
		return apierror.InvalidField("messages", "too many multimodal items: got %d, max %d", len(entries), s.maxEntries)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.maxConc)
	downloads := 0
	for i := range entries {
		e := &entries[i]
		where := partName(e)
		if hasPrefixFold(e.URL, "data:") {
			ct, err := checkDataURL(e.URL, kindOf(e.Kind))
			if err != nil {
				return apierror.InvalidField("messages", "%s: %v", where, err)
			}
			e.ContentType = ct
			continue
		}
		u, err := url.Parse(e.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return apierror.InvalidField("messages", "%s: media URL must be an http(s) or data: URL", where)
		}
		if err := s.guard.checkHost(u.Hostname()); err != nil {
			return apierror.InvalidField("messages", "%s: media URL blocked: %v", where, err)
		}
		downloads++
		g.Go(func() error {
			data, ct, err := s.fetch(gctx, u, e)
			if err != nil {
				return err
			}
			e.URL = "data:" + ct + ";base64," + base64.StdEncoding.EncodeToString(data)
			e.ContentType = ct
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if downloads > 0 {
		if err := setMediaURLs(rc.Body, entries); err != nil {
			return err
		}
	}
	rc.Media = entries
	rc.Log.V(logging.Debug).Info("media inlined", "items", len(entries), "downloads", downloads)
	return nil
}

// fetch downloads one media item with a fresh request: no client header (Authorization, cookies)
// ever reaches a media host.
func (s *replaceMediaURLs) fetch(ctx context.Context, u *url.URL, e *request.MediaEntry) ([]byte, string, error) {
	where := partName(e)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, "", apierror.InvalidField("messages", "%s: invalid media URL", where)
	}
	req.Header.Set("User-Agent", "epd-coordinator")
	req.Header.Set("Accept", strings.Join(kindOf(e.Kind).mediaTypes, ", "))
	start := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		s.metrics.Upstream("media", 0, time.Since(start))
		var blocked *blockedError
		if errors.As(err, &blocked) {
			return nil, "", apierror.InvalidField("messages", "%s: media URL blocked: %v", where, blocked.err)
		}
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		return nil, "", mediaHostError(where, fmt.Sprintf("download failed: %v", stripURL(err)), err)
	}
	defer resp.Body.Close()
	defer func() { s.metrics.Upstream("media", resp.StatusCode, time.Since(start)) }()
	if resp.StatusCode != http.StatusOK {
		return nil, "", mediaHostError(where, fmt.Sprintf("media host answered HTTP %d", resp.StatusCode), nil)
	}
	if resp.ContentLength > s.maxBytes {
		return nil, "", apierror.InvalidField("messages", "%s: media is %d bytes, more than max_download_size (%d)", where, resp.ContentLength, s.maxBytes)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, s.maxBytes+1))
	if err != nil {
		return nil, "", mediaHostError(where, "download broke off", err)
	}
	if int64(len(data)) > s.maxBytes {
		return nil, "", apierror.InvalidField("messages", "%s: media is more than max_download_size (%d bytes)", where, s.maxBytes)
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ct == "" || ct == "application/octet-stream" {
		ct, _, _ = mime.ParseMediaType(http.DetectContentType(data))
	}
	if !allowedType(ct, kindOf(e.Kind)) {
		return nil, "", apierror.InvalidField("messages", "%s: downloaded content is %q, not one of %s", where, ct, strings.Join(kindOf(e.Kind).mediaTypes, ", "))
	}
	return data, ct, nil
}

func mediaHostError(where, msg string, cause error) *apierror.Error {
	return &apierror.Error{Status: http.StatusBadGateway, Type: apierror.TypeAPI, Code: "media_fetch_failed", Message: where + ": " + msg, Cause: cause}
}

// stripURL keeps the cause of a transport error without repeating the URL.
func stripURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// checkDataURL validates data:<media type>[;params];base64,<data> and returns the media type.
func checkDataURL(u string, k *mediaKind) (string, error) {
	header, payload, ok := strings.Cut(u[len("data:"):], ",")
	if !ok {
		return "", errors.New("malformed data: URL (no comma)")
	}
	params := strings.Split(header, ";")
	mt := strings.ToLower(strings.TrimSpace(params[0]))
	isBase64 := false
	for _, p := range params[1:] {
		if strings.EqualFold(strings.TrimSpace(p), "base64") {
			isBase64 = true
		}
	}
	switch {
	case !isBase64:
		return "", errors.New("data: URL must be base64-encoded (;base64)")
	case mt == "":
		return "", errors.New("data: URL has no media type")
	case !allowedType(mt, k):
		return "", fmt.Errorf("data: URL media type %q is not one of %s", mt, strings.Join(k.mediaTypes, ", "))
	case len(strings.TrimSpace(payload)) == 0:
		return "", errors.New("data: URL has no data")
	case !base64Shaped(payload):
		return "", errors.New("data: URL payload is not valid base64")
	}
	return mt, nil
}

// base64Shaped checks the alphabet and padding of standard base64 without decoding.
func base64Shaped(s string) bool {
	n := len(s)
	for n > 0 && s[n-1] == '=' {
		n--
	}
	if len(s)-n > 2 || (len(s)-n > 0 && len(s)%4 != 0) {
		return false
	}
	for i := 0; i < n; i++ {
		if !base64Alphabet[s[i]] {
			return false
		}
	}
	return n%4 != 1
}

var base64Alphabet = func() (t [256]bool) {
	for _, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/" {
		t[c] = true
	}
	return t
}()

func allowedType(mt string, k *mediaKind) bool {
	for _, t := range k.mediaTypes {
		if mt == t {
			return true
		}
	}
	return false
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// partName locates a media item for error messages.
func partName(e *request.MediaEntry) string {
	return fmt.Sprintf("messages[%d].content[%d] (%s)", e.Message, e.Part, e.Kind)
}
