package media

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// Inliner downloads the remote media of a conversational request (concurrently, bounded, behind
// an SSRF guard) and inlines it as base64 data: URLs, so that render, encode and every worker see
// the same bytes and no worker fetches anything: the replace-media-urls step. Every media part is
// checked (see mediaKinds): inline data is validated, parts that could make a worker fetch a URL
// the guard did not approve are refused, and what sniffing tells of the bytes must be of the
// part's modality. Memory is bounded per item, per request and per process (Options.Budget), and
// each modality (image, audio, video) has its own item size, item count and media types
// (modalities). It records one media entry per item (image_url, video_url, audio_url,
// input_audio), in document order.
type Inliner struct {
	client     *http.Client
	guard      *netGuard
	maxConc    int
	maxEntries int
	// Byte limits: per request (all its media), the body after inlining, and the process-wide
	// budget of media held by requests in flight.
	maxRequest, maxBody, maxInFlight int64
	// limits are each modality's item size, item count and media types.
	limits map[string]*mediaLimits
	// inFlight is the process-wide count maxInFlight bounds (Options.Budget), shared by every
	// inliner of the process, across pipeline reloads.
	inFlight *budget.Bytes
	metrics  *observe.Metrics
}

// maxMiB bounds the MiB params (1 TiB), so that their byte counts cannot overflow.
const maxMiB = 1 << 20

// Options are what an Inliner takes besides its params.
type Options struct {
	// Budget is the process's media budget (nil: the inliner's own).
	Budget *budget.Bytes
	// AllowAddr exempts addresses from the SSRF guard (a loopback media server in tests).
	AllowAddr func(netip.Addr) bool
	// Metrics counts the media items and downloads.
	Metrics *observe.Metrics
}

// New builds an inliner from the replace-media-urls params p (errors are recorded on p). It does
// no I/O.
func New(p *params.Params, o Options) *Inliner {
	mib := func(name string, def int) int64 {
		n := p.Int(name, def, 1)
		if n > maxMiB {
			p.Fail(name, "must be at most %d (MiB), got %d", maxMiB, n)
		}
		return int64(n) << 20
	}
	s := &Inliner{
		maxConc:     p.Int("max_concurrent_downloads", 10, 1),
		maxEntries:  p.Int("max_multimodal_entries", 32, 0),
		maxRequest:  mib("max_request_media_size", 32),
		maxBody:     mib("max_inlined_body_size", 64),
		maxInFlight: mib("max_inflight_media_size", 128),
		inFlight:    cmp.Or(o.Budget, &budget.Bytes{}),
		metrics:     o.Metrics,
	}
	if s.maxEntries == 0 {
		p.Fail("max_multimodal_entries", "must be at least 1 (0 no longer means unlimited; the default is 32)")
	}
	if need := s.maxRequest + s.maxBody; s.maxInFlight < need {
		// A request holds up to its downloads and its inlined body at once.
		p.Fail("max_inflight_media_size", "must be at least max_request_media_size + max_inlined_body_size (%d MiB)", need>>20)
	}
	s.limits = modalityLimits(p, mib("max_download_size", 10), s.maxRequest, max(s.maxEntries, 1))
	timeout := p.Duration("download_timeout", 10*time.Second)
	var allowed []netip.Prefix
	if p.Bool("allow_private_networks", false) {
		allowed = append(allowed, privateRanges...)
	}
	for _, n := range p.StringList("allowed_networks") {
		pfx, err := netip.ParsePrefix(strings.TrimSpace(n))
		if a, aerr := netip.ParseAddr(strings.TrimSpace(n)); err != nil && aerr == nil && a.Zone() == "" {
			pfx = netip.PrefixFrom(a, a.BitLen()) // a single address
			err = nil
		}
		switch {
		case err != nil:
			p.Fail("allowed_networks", "%q is not a CIDR prefix (e.g. 10.20.0.0/16) or an IP address", n)
		case pfx != pfx.Masked():
			p.Fail("allowed_networks", "%q has bits set after the prefix length (did you mean %s?)", n, pfx.Masked())
		case pfx.Addr().Is4In6():
			p.Fail("allowed_networks", "%q is an IPv4-mapped prefix; write it as IPv4", n)
		}
		allowed = append(allowed, pfx)
	}
	var domains []string
	for _, d := range p.StringList("allowed_domains") {
		d = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(d), "."))
		if d == "" || strings.ContainsAny(d, "/:* ") {
			p.Fail("allowed_domains", "%q is not a domain name", d)
		}
		domains = append(domains, d)
	}
	s.guard = newNetGuard(allowed, portsParam(p), domains, o.AllowAddr)
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
				return refuse(reasonRedirects, "%d redirects", len(via))
			}
			if r := s.guard.checkURL(req.URL); r != nil {
				return &refusal{reason: "it redirects where " + r.reason, err: fmt.Errorf("redirect to %s: %w", req.URL.Redacted(), r.err)}
			}
			return nil
		},
	}
	return s
}

// portsParam reads allowed_ports: the ports media URLs and redirects may use (default 80, 443).
func portsParam(p *params.Params) []uint16 {
	v, ok := p.Value("allowed_ports")
	if !ok {
		return []uint16{80, 443}
	}
	items, isList := v.([]any)
	if !isList || len(items) == 0 {
		p.Fail("allowed_ports", "must be a non-empty list of port numbers")
		return nil
	}
	ports := make([]uint16, 0, len(items))
	for i, it := range items {
		var n float64
		switch x := it.(type) {
		case int:
			n = float64(x)
		case int64:
			n = float64(x)
		case float64:
			n = x
		default:
			p.Fail("allowed_ports", "item %d must be a port number, got %T", i, it)
			return nil
		}
		if n != float64(int(n)) || n < 1 || n > 65535 {
			p.Fail("allowed_ports", "item %d must be a port number (1-65535), got %v", i, it)
			return nil
		}
		ports = append(ports, uint16(n))
	}
	return ports
}

// Close drops pooled connections to media hosts.
func (s *Inliner) Close() { s.client.CloseIdleConnections() }

// Replace checks, downloads and inlines the media of rc's conversation, laid out as l, and sets
// rc.Media (one entry per item) and rc.MediaScanned. The bytes it holds of the budget are let go
// when ctx ends.
func (s *Inliner) Replace(ctx context.Context, rc *request.Context, l Layout) error {
	items, err := walk(rc.Body, l)
	if err != nil {
		return err
	}
	rc.MediaScanned = true
	if len(items) == 0 {
		return nil
	}
	if len(items) > s.maxEntries {
		return apierror.InvalidField(l.Messages, "too many multimodal items: got %d, max %d (max_multimodal_entries)", len(items), s.maxEntries)
	}
	if err := s.checkCounts(items, l.Messages); err != nil {
		return err
	}
	use := &mediaUse{s: s}
	if err := s.inline(ctx, rc, l, items, use); err != nil {
		use.release()
		return err
	}
	if ctx.Done() == nil {
		use.release() // nothing tells when the request ends (embedders only: the server's ctx ends with it)
	} else {
		context.AfterFunc(ctx, use.release) // the inlined body lives as long as the request
	}
	rc.Media = nil
	for i := range items {
		it := &items[i]
		source := observe.MediaInline
		if it.fetched {
			source = observe.MediaDownloaded
		}
		s.metrics.MediaItem(it.kind.modality, source)
		if it.kind.entry {
			rc.Media = append(rc.Media, request.MediaEntry{Message: it.msg, Part: it.part, Kind: it.kind.partType, URL: it.url, ContentType: it.contentType})
		}
	}
	rc.Log.V(logging.Debug).Info("media inlined", "items", len(items), "bytes", use.total.Load())
	return nil
}

// inline checks every item, downloads the remote ones and writes the body.
func (s *Inliner) inline(ctx context.Context, rc *request.Context, l Layout, items []mediaItem, use *mediaUse) error {
	var downloads []*mediaItem
	var urls []*url.URL
	for i := range items {
		it := &items[i]
		if it.problem != "" {
			rc.Log.V(logging.Verbose).Info("media part refused", "part", it.where(), "reason", it.problem)
			return apierror.InvalidField(it.key, "%s: %s", it.where(), it.problem)
		}
		var err error
		var head []byte // the data's first bytes, for sniffing
		switch {
		case it.kind.dataOnly:
			var ok bool
			if it.size, ok = base64Size(it.url); !ok {
				err = errors.New("data is not valid padded base64")
			} else if it.contentType, err = s.audioFormat(it); err != nil {
				return err
			}
			head = base64Head(it.url)
		case hasPrefixFold(it.url, "data:"):
			it.contentType, it.size, err = checkDataURL(it.url, s.limits[it.kind.modality].types)
			head = dataURLHead(it.url)
		default:
			u, perr := url.Parse(it.url)
			if perr != nil {
				return apierror.InvalidField(it.key, "%s: the media URL is malformed", it.where())
			}
			if r := s.guard.checkURL(u); r != nil {
				return s.refused(rc, it, r, r)
			}
			downloads, urls = append(downloads, it), append(urls, u)
			continue
		}
		if err != nil {
			return apierror.InvalidField(it.key, "%s: %v", it.where(), err)
		}
		if err := s.checkItemSize(it, it.size); err != nil {
			return err
		}
		if err := s.checkContent(it, head); err != nil {
			return err
		}
		if err := use.add(it, it.size); err != nil {
			return err
		}
	}
	if len(downloads) > 0 {
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(s.maxConc)
		for i, it := range downloads {
			g.Go(func() error {
				start := time.Now()
				err := s.fetch(gctx, rc, it, urls[i], use)
				s.metrics.MediaDownload(gctx, err, time.Since(start))
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
	}
	return s.writeBody(rc, l, items, use)
}

// checkItemSize applies the item's modality size limit (max_download_size unless overridden).
func (s *Inliner) checkItemSize(it *mediaItem, n int64) error {
	if lim := s.limits[it.kind.modality]; n > lim.maxSize {
		return apierror.InvalidField(it.key, "%s: the media is %d bytes, more than %s (%d bytes)", it.where(), n, lim.sizeParam, lim.maxSize)
	}
	return nil
}

// readChunk is the unit in which downloads are read and reserved: a multiple
// of 3 bytes, so that the chunks base64-encode independently.
const readChunk = 3 << 16

// fetch downloads one media item with a fresh request: no client header (Authorization, cookies)
// ever reaches a media host. A declared length is checked against the item and request limits at
// once; the process budget is reserved chunk by chunk before each chunk is read.
func (s *Inliner) fetch(ctx context.Context, rc *request.Context, it *mediaItem, u *url.URL, use *mediaUse) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return apierror.InvalidField(it.key, "%s: the media URL is malformed", it.where())
	}
	req.Header.Set("User-Agent", "epd-coordinator")
	types := s.limits[it.kind.modality].types
	req.Header.Set("Accept", strings.Join(types, ", "))
	start := time.Now()
	resp, err := s.client.Do(req)
	if err != nil {
		s.metrics.Upstream("media", 0, time.Since(start))
		return s.fetchFailed(ctx, rc, it, err)
	}
	defer resp.Body.Close()
	defer func() { s.metrics.Upstream("media", resp.StatusCode, time.Since(start)) }()
	if resp.StatusCode != http.StatusOK {
		return mediaHostError(it, fmt.Sprintf("the media host answered HTTP %d", resp.StatusCode), nil)
	}
	declared := resp.ContentLength >= 0
	if declared {
		if err := s.checkItemSize(it, resp.ContentLength); err != nil {
			return err
		}
		if err := use.add(it, resp.ContentLength); err != nil {
			return err
		}
	}
	for {
		// Reserve only as the bytes arrive: a host that declares a large length and then stalls
		// holds one chunk of the process budget per download, not its declared size.
		if err := use.hold(readChunk); err != nil {
			return err
		}
		buf := make([]byte, readChunk)
		got, err := io.ReadFull(resp.Body, buf)
		if unused := int64(readChunk - got); unused > 0 {
			use.drop(unused)
		}
		if got > 0 {
			it.data = append(it.data, buf[:got])
			it.size += int64(got)
			if err := s.checkItemSize(it, it.size); err != nil {
				return err
			}
			if !declared {
				if err := use.add(it, int64(got)); err != nil {
					return err
				}
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			if declared && it.size != resp.ContentLength {
				return mediaHostError(it, "the download broke off", err)
			}
			break
		}
		if err != nil {
			return s.fetchFailed(ctx, rc, it, err)
		}
	}
	if it.size == 0 {
		return apierror.InvalidField(it.key, "%s: the downloaded media is empty", it.where())
	}
	// The declared type must be accepted, and what sniffing tells of the bytes too (checkContent);
	// without a declared type, the sniffed one names the data.
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ct == "" || ct == "application/octet-stream" {
		ct = cmp.Or(sniffMedia(it.data[0]), "application/octet-stream")
		if t := asAllowed(ct, types); t != "" {
			ct = t
		}
	}
	if !allowedType(ct, types) {
		return apierror.InvalidField(it.key, "%s: the downloaded content is %q, not one of %s", it.where(), ct, strings.Join(types, ", "))
	}
	if err := s.checkContent(it, it.data[0]); err != nil {
		return err
	}
	it.contentType, it.fetched = ct, true
	return nil
}

// fetchFailed maps a failed download to the client's error without the details of the network
// (resolved addresses, the DNS server), which go to the log and the error's cause.
func (s *Inliner) fetchFailed(ctx context.Context, rc *request.Context, it *mediaItem, err error) error {
	if r := (*refusal)(nil); errors.As(err, &r) {
		return s.refused(rc, it, r, err)
	}
	if ctx.Err() != nil {
		return ctx.Err() // the request ended, or another item failed first
	}
	rc.Log.V(logging.Verbose).Info("media download failed", "part", it.where(), "err", err.Error())
	var dns *net.DNSError
	var ne net.Error
	switch {
	case errors.As(err, &dns) && dns.IsNotFound:
		e := apierror.InvalidField(it.key, "%s: the media host could not be resolved", it.where())
		e.Cause = err
		return e
	case errors.As(err, &dns):
		return mediaHostError(it, "the media host could not be resolved", err)
	case errors.As(err, &ne) && ne.Timeout():
		return mediaHostError(it, "the media host timed out", err)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return mediaHostError(it, "the download broke off", err)
	}
	return mediaHostError(it, "the media host could not be reached", err)
}

// refused is the 400 of a URL the guard refused (r, within err); what was refused (the address)
// is logged only.
func (s *Inliner) refused(rc *request.Context, it *mediaItem, r *refusal, err error) error {
	rc.Log.V(logging.Verbose).Info("media URL refused", "part", it.where(), "err", err.Error())
	e := apierror.InvalidField(it.key, "%s: media URL refused: %s", it.where(), r.reason)
	e.Cause = err
	return e
}

func mediaHostError(it *mediaItem, msg string, cause error) *apierror.Error {
	return &apierror.Error{Status: http.StatusBadGateway, Type: apierror.TypeAPI, Code: "media_fetch_failed", Message: it.where() + ": " + msg, Cause: cause}
}
