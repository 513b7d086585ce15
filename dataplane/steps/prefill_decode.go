package steps

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/relay"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// PrefillDecodeStep is the type name of the terminal step that runs prefill and decode together.
const PrefillDecodeStep = "prefill-decode"

func init() { builder.Register(builder.Type{Name: PrefillDecodeStep, New: newPrefillDecode}) }

// Phases of the prefill-decode step's legs, for logs, spans and metrics.
const (
	phaseReserve     = "reserve"
	phasePairPrefill = PrefillStep
	phasePairDecode  = DecodeStep
)

// prefillDecode replaces prefill and decode for kv-sglang, whose transfer needs both in flight
// together with the prefill's host known when decode is sent (upstream's prefill-decode step,
// llm-d-router#2974):
//
//  1. reserve: the prefill leg's body with "Prefer: reserve-endpoint"; the endpoint picker
//     chooses a prefill endpoint and names it (204 with x-llm-d-reserved-host-port, or the first
//     plugin's 200 with x-prefill-host-port) without forwarding anything;
//  2. prefill (pinned to that endpoint with x-llm-d-pin-host-port) and decode are sent at once,
//     both with SGLang's bootstrap_host (the reserved endpoint's), bootstrap_port and one
//     bootstrap_room, and no kv_transfer_params;
//  3. decode's answer is relayed as the decode step relays it.
//
// A failure of either leg cancels the other: a prefill that fails before decode produced
// anything ends decode at once (SGLang's decode would wait out its bootstrap timeout) and the
// client gets the prefill's error, or a new pair when it failed unserved; a decode that fails
// cancels the prefill waiting for it. Once decode has streamed, the KV has arrived: a prefill
// failing then changes nothing. A stream that breaks later is resumed with a new pair.
type prefillDecode struct {
	gw   *gateway.Client
	port int      // SGLang's bootstrap port (SGLANG_BOOTSTRAP_PORT)
	legs *prefill // builds the prefill body (without kv_transfer_params)
	ans  relay.Answerer
	// unsupported is when a reservation last found that the picker has no reserve-endpoint
	// plugin (unix nanoseconds, 0: never): for pluginRecheck after it, requests are refused
	// without sending a reservation that a worker would serve as a prefill.
	unsupported atomic.Int64
}

// pluginRecheck is how long the step trusts that the picker lacks the reserve-endpoint plugin
// before it asks again (a new picker may have been rolled out meanwhile).
const pluginRecheck = 30 * time.Second

// errNoReservePlugin is a reservation the endpoint picker scheduled and a worker served as a
// plain prefill: the picker runs no reserve-endpoint plugin. Every request of the step would
// fail the same way (and cost a worker a prefill), so it says what to change.
var errNoReservePlugin = &apierror.Error{Status: http.StatusNotImplemented, Type: apierror.TypeAPI, Code: "reserve_endpoint_unsupported",
	Message: "prefill-decode needs the endpoint picker's reserve-endpoint plugin (llm-d-router's reserveendpoint, which answers Prefer: reserve-endpoint " +
		"with 204 and x-llm-d-reserved-host-port), and the picker in front of this pool does not run it: the reservation was scheduled and served " +
		"as a plain prefill. Configure the plugin in the EndpointPickerConfig, or run prefill and decode steps with a connector other than kv-sglang"}

func newPrefillDecode(deps builder.Deps, p *params.Params) (pipeline.Step, error) {
	deps.RequireGateway(p, PrefillDecodeStep)
	c := kvConnector(deps, p)
	port, ok := kv.BootstrapPort(c)
	if c != nil && !ok {
		p.Fail(paramKVConnector, "the %s step runs SGLang's transfer and needs %s, got %q (use prefill and decode steps with other connectors)",
			PrefillDecodeStep, kv.SGLang, c.Name())
	}
	s := &prefillDecode{gw: deps.Gateway, port: port, legs: &prefill{ec: ecConnector(p), useOpenAI: p.Bool(paramUseOpenAIFormat, true)}}
	s.ans = newAnswerer(deps, p, s.resend)
	return s, nil
}

var _ pipeline.Terminal = (*prefillDecode)(nil)

func (*prefillDecode) Name() string   { return PrefillDecodeStep }
func (*prefillDecode) Terminal() bool { return true }

// Execute runs pairs until one is answered or no retry is left (gateway.retry): a pair whose
// reservation or legs failed unserved, before the client got anything, is tried again whole,
// with a new reservation and room. Once the answer is written, the prefills still running get
// prefillGrace to answer (see settle).
func (s *prefillDecode) Execute(ctx context.Context, rc *request.Context) error {
	format := wire.Of(rc.API).Legs(s.legs.useOpenAI)
	pre, err := format.Prefill(rc, wire.Transfer{EC: s.legs.ecParams(rc)}) // no KV parameters: SGLang's bootstrap fields replace them
	if err != nil {
		return err
	}
	dec, err := wire.Of(rc.API).Decode(rc, rc.Body, nil)
	if err != nil {
		return err
	}
	ctx, pairs := withPairs(ctx)
	defer pairs.settle()
	legs := pairLegs{prefill: pre, prefillPath: format.Path(), decode: dec, stream: rc.Stream}
	if h := rc.Hints[gateway.ProfilePrefill]; len(h) > 0 {
		legs.hint = h[0]
	}
	return s.run(ctx, rc, legs, func(resp *http.Response) (string, error) {
		err := s.ans.Respond(ctx, rc, relay.ClientOf(rc), resp, PrefillDecodeStep)
		if !errors.Is(err, upstream.ErrNotStarted) {
			return "", err
		}
		if perr := prefillFailure(resp); perr != nil {
			return phasePairPrefill, perr
		}
		return phasePairDecode, &apierror.UpstreamError{Phase: phasePairDecode, Status: resp.StatusCode, Err: err}
	})
}

// resend continues a broken stream with a new pair for cont, the continuation's body (in the
// client's format): its prefill computes the longer prompt, capped to one token, with the
// request's EC descriptors; the answerer relays its decode's answer.
func (s *prefillDecode) resend(ctx context.Context, rc *request.Context, cont *body.Object) (*http.Response, error) {
	pre, err := wire.Of(rc.API).Continue(cont, s.legs.ecParams(rc))
	if err != nil {
		return nil, err
	}
	var out *http.Response
	err = s.run(ctx, rc, pairLegs{prefill: pre, prefillPath: rc.Path, decode: cont, stream: true}, func(resp *http.Response) (string, error) {
		out = resp
		return "", nil
	})
	return out, err
}

// run sends pairs of legs until one is answered and handled by use, or no retry is left: a pair
// that failed, or whose answer use reports failed in phase before the client got anything, is
// retried when unserved (retry.ClassifyCall). Only the first pair takes legs.hint: the hint may
// be why it failed. It returns the last failure.
func (s *prefillDecode) run(ctx context.Context, rc *request.Context, legs pairLegs, use func(*http.Response) (phase string, err error)) error {
	_, err := gateway.Do(ctx, s.gw.Retrier(), rc.Log, func(int) (struct{}, error) {
		resp, phase, err := s.pair(ctx, rc, legs) //nolint:bodyclose // use relays and closes it
		legs.hint = ""
		if err == nil {
			if phase, err = use(resp); phase == "" {
				return struct{}{}, err
			}
		}
		return struct{}{}, retry.IfUnserved(ctx, phase, err)
	}, nil)
	return err
}

// pairLegs are the bodies of a pair before SGLang's fields are set (each pair sets its own).
type pairLegs struct {
	prefill     *body.Object // capped to one token
	prefillPath string
	decode      *body.Object
	stream      bool   // the decode leg streams
	hint        string // the prefill endpoint a conditional decode's 412 named, or ""
}

// pair reserves a prefill endpoint (or takes legs.hint) and sends the prefill and decode legs
// together. It returns decode's answer, whose Body ends the prefill when closed unless it was
// read whole (withPairs' settle ends it then), or the error of the phase that failed: a decode
// answer that is not 2xx comes back as an error too (nothing was relayed; the client gets it as
// the OpenAI error of the other legs' failures, its worker message kept).
func (s *prefillDecode) pair(ctx context.Context, rc *request.Context, legs pairLegs) (*http.Response, string, error) {
	endpoint, err := netip.ParseAddrPort(legs.hint)
	if legs.hint == "" || err != nil {
		if at := s.unsupported.Load(); at != 0 && time.Since(time.Unix(0, at)) < pluginRecheck {
			return nil, phaseReserve, errNoReservePlugin
		}
		if endpoint, err = s.reserve(ctx, rc, legs.prefillPath, legs.prefill); err != nil {
			return nil, phaseReserve, err
		}
	}
	b := kv.Bootstrap{Host: endpoint.Addr().String(), Port: s.port, Room: rand.Int64()}
	pre := legs.prefill.Clone() // the reservation's body stays as it was sent
	b.Apply(pre)
	dec := legs.decode.Clone()
	b.Apply(dec)
	if l := rc.Log.V(logging.Debug); l.Enabled() {
		l.Info("prefill endpoint reserved; sending prefill and decode together", "endpoint", endpoint.String(), "bootstrap_room", b.Room)
	}

	// The pair's legs do not end with the request's context by themselves: a client that leaves
	// before it has decode's whole answer cancels them, one that leaves once it has it (the
	// stream's last bytes still in flight) does not, so the prefill still settles (see settle).
	pctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	p := &pairedBody{cancel: cancel, done: make(chan struct{})}
	p.stop = context.AfterFunc(ctx, func() {
		if !p.whole.Load() {
			cancel(context.Cause(ctx))
		}
	})
	trackPair(ctx, p)
	pleg := gateway.NewLeg(rc, gateway.ProfilePrefill, legs.prefillPath, pre).With(gateway.PinHeader, endpoint.String())
	pleg.Phase = phasePairPrefill
	go p.prefill(pctx, s.gw, pleg)

	dleg := gateway.NewLeg(rc, gateway.ProfileDecode, rc.Path, dec)
	dleg.Phase, dleg.Stream = phasePairDecode, legs.stream
	resp, err := s.gw.Do(pctx, dleg)
	if err == nil && resp.StatusCode/100 != 2 {
		err = upstream.ErrorOf(phasePairDecode, resp)
	}
	if err != nil {
		// A decode that refused may have been refused for its prefill: its own failure decides.
		var up *apierror.UpstreamError
		grace := time.Duration(0)
		if errors.As(err, &up) && up.Status >= 400 && up.Status < 500 && up.Status != http.StatusTooManyRequests {
			grace = prefillGrace
		}
		p.end(errDecodeFailed, grace)
		if perr := p.failure(); perr != nil {
			return nil, phasePairPrefill, perr // the prefill failed first: decode was cancelled for it
		}
		if !errors.As(err, &up) {
			err = &apierror.UpstreamError{Phase: phasePairDecode, Err: err}
		}
		return nil, phasePairDecode, err
	}
	p.ReadCloser, p.left = resp.Body, resp.ContentLength
	resp.Body = p
	return resp, phasePairDecode, nil
}

// reserve asks the endpoint picker for a prefill endpoint (Prefer: reserve-endpoint) with the
// prefill leg's body, so that it schedules as for the prefill itself.
func (s *prefillDecode) reserve(ctx context.Context, rc *request.Context, path string, pre *body.Object) (netip.AddrPort, error) {
	leg := gateway.NewLeg(rc, gateway.ProfilePrefill, path, pre).WithID("-reserve")
	leg.Prefer, leg.Phase = gateway.PreferReserveEndpoint, phaseReserve
	resp, err := s.gw.Do(ctx, leg) //nolint:bodyclose // ErrorOf or Discard closes it
	if err != nil {
		return netip.AddrPort{}, &apierror.UpstreamError{Phase: phaseReserve, Err: err}
	}
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return netip.AddrPort{}, upstream.ErrorOf(phaseReserve, resp)
	}
	served := upstream.Drain(resp) > 0
	if resp.StatusCode == http.StatusOK && served && resp.Header.Get(gateway.LegacyReservedHeader) == "" && resp.Header.Get(gateway.ReservedHeader) == "" {
		// A worker's answer: the picker scheduled the reservation as a prefill.
		if s.unsupported.Swap(time.Now().UnixNano()) == 0 {
			rc.Log.Error(errNoReservePlugin, "the endpoint picker has no reserve-endpoint plugin; prefill-decode requests are refused until it does (checked again every 30s)")
		}
		return netip.AddrPort{}, errNoReservePlugin
	}
	s.unsupported.Store(0)
	return reservedEndpoint(resp, s.gw.AllowedHintNetworks())
}

// maxEndpointLen bounds a reserved endpoint header (an IPv6 address in brackets and a port).
const maxEndpointLen = 64

// reservedEndpoint reads the endpoint a reservation answered: x-llm-d-reserved-host-port on
// a 204 (llm-d's reserve-endpoint plugin), x-prefill-host-port on a 200 (its first version). It
// must be one a pod can have (gateway.EndpointOf, with allowed: gateway.allowed_hint_networks):
// the prefill leg is pinned to it and the decode worker connects to it (bootstrap_host).
func reservedEndpoint(resp *http.Response, allowed []netip.Prefix) (netip.AddrPort, error) {
	name := gateway.ReservedHeader
	if resp.StatusCode == http.StatusOK {
		name = gateway.LegacyReservedHeader
	}
	v := resp.Header.Get(name)
	fail := func(why string) (netip.AddrPort, error) {
		return netip.AddrPort{}, &apierror.UpstreamError{Phase: phaseReserve, Status: resp.StatusCode,
			Err: fmt.Errorf("the endpoint picker's reservation (%d) %s; is its reserve-endpoint plugin configured?", resp.StatusCode, why)}
	}
	if v == "" {
		return fail("has no " + name + " header")
	}
	if len(v) > maxEndpointLen {
		return fail(fmt.Sprintf("has a %s header of %d bytes", name, len(v)))
	}
	ap, err := gateway.EndpointOf(v, allowed)
	var refused *gateway.RefusedAddressError
	if errors.As(err, &refused) {
		return netip.AddrPort{}, &apierror.UpstreamError{Phase: phaseReserve, Status: resp.StatusCode,
			Err: fmt.Errorf("the endpoint picker's reservation (%d) names %s in %s, %s, which no pod has: neither the prefill leg "+
				"nor the decode worker's KV transfer goes there (gateway.allowed_hint_networks admits loopback and link-local networks)",
				resp.StatusCode, refused.Endpoint, strings.ToLower(name), refused.Reason)}
	}
	if err != nil {
		return fail(fmt.Sprintf("names %q in %s, not an ip:port", v, name))
	}
	return ap, nil
}

// errDecodeFailed cancels a prefill whose decode failed (nobody waits for its KV any more) and
// errDecodeDone one whose decode was answered.
var (
	errDecodeFailed = errors.New("the decode leg failed")
	errDecodeDone   = errors.New("the decode leg is done")
)

// pairedBody is the decode answer of a pair. Its first byte means the KV arrived: from then on
// a prefill failure no longer ends decode. Close of an answer that broke off cancels the prefill
// leg and waits for it; one read whole leaves it to settle.
type pairedBody struct {
	io.ReadCloser
	cancel  context.CancelCauseFunc
	done    chan struct{} // closed when the prefill leg ended
	started atomic.Bool   // decode's first byte was read
	left    int64         // bytes of the Content-Length not read yet; -1 when unknown
	// whole is set once decode's answer was read to its end (EOF, or its Content-Length); the
	// request context's watcher reads it too (stop releases the watcher).
	whole atomic.Bool
	stop  func() bool
	err   error // the prefill's failure (set before done is closed)
	once  sync.Once
}

// prefill sends the pinned prefill leg and reads its answer; a failure before decode started
// cancels the pair's context (decode's leg) with it.
func (p *pairedBody) prefill(ctx context.Context, gw *gateway.Client, leg gateway.Leg) {
	defer close(p.done)
	resp, err := gw.Do(ctx, leg) //nolint:bodyclose // ReadOK closes it
	if err == nil {
		_, err = upstream.ReadOK(phasePairPrefill, resp, gw.MaxResponseBytes())
	}
	if err == nil || errors.Is(context.Cause(ctx), errDecodeFailed) || errors.Is(context.Cause(ctx), errDecodeDone) {
		return
	}
	var up *apierror.UpstreamError
	if !errors.As(err, &up) {
		err = &apierror.UpstreamError{Phase: phasePairPrefill, Err: err}
	}
	p.err = err
	if !p.started.Load() {
		p.cancel(err)
	}
}

// failure returns the prefill's failure once the prefill leg ended (nil when it succeeded or
// was cancelled for its decode).
func (p *pairedBody) failure() error {
	<-p.done
	return p.err
}

// prefillGrace is how long the prefill leg may still take to end by itself once its decode
// ended: after an answered decode it answers when the transfer is done, long before decode ends,
// but the two answers race; after a decode that refused (4xx) it fails too when the refusal was
// its fault (a dead prefill pod's bootstrap server is unreachable) or the request's.
const prefillGrace = 2 * time.Second

// end ends the prefill leg and waits for it: cancelled with cause at once, or once grace has
// passed without it ending by itself.
func (p *pairedBody) end(cause error, grace time.Duration) {
	p.once.Do(func() {
		if grace > 0 {
			t := time.NewTimer(grace)
			select {
			case <-p.done:
			case <-t.C:
			}
			t.Stop()
		}
		p.cancel(cause) // nothing to cancel any more when it ended; releases the context
		<-p.done
		p.stop()
	})
}

func (p *pairedBody) Read(b []byte) (int, error) {
	n, err := p.ReadCloser.Read(b)
	if n > 0 {
		p.started.Store(true)
	}
	if p.left >= 0 {
		p.left -= int64(n)
	}
	if err == io.EOF || p.left == 0 {
		p.whole.Store(true)
	}
	return n, err
}

func (p *pairedBody) Close() error {
	err := p.ReadCloser.Close()
	if !p.whole.Load() {
		p.end(errDecodeFailed, 0) // decode broke off: nobody waits for the prefill's KV
	}
	return err
}

// pairsKey carries a request's pairs (withPairs).
type pairsKey struct{}

// pairs are the pairs one request sent, so that the prefills of answered ones are settled once
// the client has its answer.
type pairs struct {
	mu   sync.Mutex
	list []*pairedBody
}

// withPairs returns ctx recording the pairs sent under it.
func withPairs(ctx context.Context) (context.Context, *pairs) {
	ps := &pairs{}
	return context.WithValue(ctx, pairsKey{}, ps), ps
}

// trackPair records p in ctx's pairs.
func trackPair(ctx context.Context, p *pairedBody) {
	if ps, ok := ctx.Value(pairsKey{}).(*pairs); ok {
		ps.mu.Lock()
		ps.list = append(ps.list, p)
		ps.mu.Unlock()
	}
}

// settle ends every pair's prefill leg: one still running (its answer raced decode's) gets
// prefillGrace, in all, to answer before it is cancelled. The client has its answer by then.
func (ps *pairs) settle() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	deadline := time.Now().Add(prefillGrace)
	for _, p := range ps.list {
		p.end(errDecodeDone, time.Until(deadline))
	}
}

// prefillFailure returns the prefill failure that ended a pair's decode answer before it
// started (nil when there was none or resp is no pair's).
func prefillFailure(resp *http.Response) error {
	p, ok := resp.Body.(*pairedBody)
	if !ok || p.started.Load() {
		return nil
	}
	return p.failure()
}
