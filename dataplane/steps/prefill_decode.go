package steps

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/body"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/gateway"
	"github.com/epd-dev/coordinator/dataplane/logging"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/request"
	"github.com/epd-dev/coordinator/dataplane/retry"
	"github.com/epd-dev/coordinator/dataplane/upstream"
)

// PrefillDecodeStep is the type name of the terminal step that runs prefill and decode together.
const PrefillDecodeStep = "prefill-decode"

func init() { registry.Register(registry.Type{Name: PrefillDecodeStep, New: newPrefillDecode}) }

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
	kv   kv.Connector
	legs *prefill // builds the prefill body (without kv_transfer_params)
	ans  answerer
}

func newPrefillDecode(deps registry.Deps, p *params.Params) (pipeline.Step, error) {
	deps.RequireGateway(p, PrefillDecodeStep)
	c := kvConnector(deps, p)
	if c != nil && c.Name() != kv.SGLang {
		p.Fail(paramKVConnector, "the %s step runs SGLang's transfer and needs %s, got %q (use prefill and decode steps with other connectors)",
			PrefillDecodeStep, kv.SGLang, c.Name())
	}
	s := &prefillDecode{gw: deps.Gateway, kv: c, legs: &prefill{ec: ecConnector(p), useOpenAI: p.Bool(paramUseOpenAIFormat, true)},
		ans: newAnswerer(deps.Gateway, p, deps.Telemetry.Metrics)}
	s.ans.resend = s.resend
	return s, nil
}

var _ pipeline.Terminal = (*prefillDecode)(nil)

func (*prefillDecode) Name() string   { return PrefillDecodeStep }
func (*prefillDecode) Terminal() bool { return true }

// Execute runs pairs until one is answered or no retry is left (gateway.retry): a pair whose
// reservation or legs failed unserved, before the client got anything, is tried again whole,
// with a new reservation and room.
func (s *prefillDecode) Execute(ctx context.Context, rc *request.Context) error {
	format := rc.API.Format(s.legs.useOpenAI)
	pre, err := s.legs.body(rc, format)
	if err != nil {
		return err
	}
	dec, err := decodeBody(rc, nil)
	if err != nil {
		return err
	}
	legs := pairLegs{prefill: pre, prefillPath: format.Path(), decode: dec, stream: rc.Stream}
	var result error
	hint := ""
	if h := rc.Hints[gateway.ProfilePrefill]; len(h) > 0 {
		hint = h[0]
	}
	rerr := s.gw.Retrier().Run(ctx, rc.Log, func() (string, retry.Failure, bool, error) {
		resp, phase, err := s.pair(ctx, rc, legs, hint) //nolint:bodyclose // respond closes it
		// A retry reserves: the hint may be why the pair failed.
		hint = ""
		if err != nil {
			result = err
			f, again := retry.ClassifyCall(ctx, err)
			return phase, f, again, nil
		}
		result = s.ans.respond(ctx, rc, resp, PrefillDecodeStep)
		if errors.Is(result, upstream.ErrNotStarted) {
			phase = phasePairDecode
			if perr := prefillFailure(resp); perr != nil {
				result, phase = perr, phasePairPrefill
			} else {
				result = &apierror.UpstreamError{Phase: phasePairDecode, Status: resp.StatusCode, Err: result}
			}
			f, again := retry.ClassifyCall(ctx, result)
			return phase, f, again, nil
		}
		return phasePairDecode, retry.Failure{}, false, nil
	}, func() {})
	if rerr != nil {
		return rerr
	}
	return result
}

// resend continues a broken stream with a new pair for cont, the continuation's body (in the
// client's format): its prefill computes the longer prompt, capped to one token, with the
// request's EC descriptors; the answerer relays its decode's answer.
func (s *prefillDecode) resend(ctx context.Context, rc *request.Context, cont *body.Object) (*http.Response, error) {
	pre, err := s.legs.continuation(rc, cont)
	if err != nil {
		return nil, err
	}
	legs := pairLegs{prefill: pre, prefillPath: rc.Path, decode: cont, stream: true}
	var out *http.Response
	var result error
	rerr := s.gw.Retrier().Run(ctx, rc.Log, func() (string, retry.Failure, bool, error) {
		resp, phase, err := s.pair(ctx, rc, legs, "") //nolint:bodyclose // the answerer's relay closes it
		if err != nil {
			result = err
			f, again := retry.ClassifyCall(ctx, err)
			return phase, f, again, nil
		}
		out, result = resp, nil
		return phasePairDecode, retry.Failure{}, false, nil
	}, func() {})
	if rerr != nil {
		return nil, rerr
	}
	return out, result
}

// pairLegs are the bodies of a pair before SGLang's fields are set (each pair sets its own).
type pairLegs struct {
	prefill     *body.Object // capped to one token
	prefillPath string
	decode      *body.Object
	stream      bool // the decode leg streams
}

// pair reserves a prefill endpoint (or takes hint, a conditional decode's 412 hint) and sends
// the prefill and decode legs together. It returns decode's answer, whose Body ends the prefill
// when closed, or the error of the phase that failed (the decode leg's non-2xx answer comes back
// as an error too: nothing was relayed).
func (s *prefillDecode) pair(ctx context.Context, rc *request.Context, legs pairLegs, hint string) (*http.Response, string, error) {
	var endpoint netip.AddrPort
	var err error
	if hint != "" {
		endpoint = netip.MustParseAddrPort(hint) // readHints validated it
	} else if endpoint, err = s.reserve(ctx, rc, legs.prefillPath, legs.prefill); err != nil {
		return nil, phaseReserve, err
	}
	b, _ := kv.NewBootstrap(s.kv, endpoint.Addr().String())
	pre := legs.prefill.Clone() // the reservation's body stays as it was sent
	b.Apply(pre)
	dec := legs.decode.Clone()
	b.Apply(dec)
	if l := rc.Log.V(logging.Debug); l.Enabled() {
		l.Info("prefill endpoint reserved; sending prefill and decode together", "endpoint", endpoint.String(), "bootstrap_room", b.Room)
	}

	pctx, cancel := context.WithCancelCause(ctx)
	p := &pairedBody{cancel: cancel, done: make(chan struct{})}
	pleg := withHeader(rc.Leg(gateway.ProfilePrefill, legs.prefillPath, pre), gateway.PinHeader, endpoint.String())
	pleg.Phase = phasePairPrefill
	go p.prefill(pctx, s.gw, pleg)

	dleg := rc.Leg(gateway.ProfileDecode, rc.Path, dec)
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
	p.ReadCloser = resp.Body
	resp.Body = p
	return resp, phasePairDecode, nil
}

// reserve asks the endpoint picker for a prefill endpoint (Prefer: reserve-endpoint) with the
// prefill leg's body, so that it schedules as for the prefill itself.
func (s *prefillDecode) reserve(ctx context.Context, rc *request.Context, path string, pre *body.Object) (netip.AddrPort, error) {
	leg := rc.Leg(gateway.ProfilePrefill, path, pre)
	leg.Prefer, leg.Phase = gateway.PreferReserveEndpoint, phaseReserve
	resp, err := s.gw.Do(ctx, leg) //nolint:bodyclose // ErrorOf or Discard closes it
	if err != nil {
		return netip.AddrPort{}, &apierror.UpstreamError{Phase: phaseReserve, Err: err}
	}
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return netip.AddrPort{}, upstream.ErrorOf(phaseReserve, resp)
	}
	upstream.Discard(resp)
	return reservedEndpoint(resp)
}

// maxEndpointLen bounds a reserved endpoint header (an IPv6 address in brackets and a port).
const maxEndpointLen = 64

// reservedEndpoint reads the endpoint a reservation answered: x-llm-d-reserved-host-port on
// a 204 (llm-d's reserve-endpoint plugin), x-prefill-host-port on a 200 (its first version).
func reservedEndpoint(resp *http.Response) (netip.AddrPort, error) {
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
	ap, err := netip.ParseAddrPort(v)
	if err != nil || ap.Port() == 0 {
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
// a prefill failure no longer ends decode. Close ends the prefill leg (cancelling it when it
// has not answered yet) and waits for it.
type pairedBody struct {
	io.ReadCloser
	cancel  context.CancelCauseFunc
	done    chan struct{} // closed when the prefill leg ended
	started atomic.Bool   // decode's first byte was read
	whole   bool          // decode's answer was read to its end
	err     error         // the prefill's failure (set before done is closed)
	once    sync.Once
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

// end ends the prefill leg and waits for it: cancelled at once with cause, or after grace when
// it has not ended by itself by then.
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
		select {
		case <-p.done:
		default:
			p.cancel(cause)
		}
		<-p.done
		p.cancel(nil) // releases the context
	})
}

func (p *pairedBody) Read(b []byte) (int, error) {
	n, err := p.ReadCloser.Read(b)
	if n > 0 {
		p.started.Store(true)
	}
	if err == io.EOF {
		p.whole = true
	}
	return n, err
}

func (p *pairedBody) Close() error {
	err := p.ReadCloser.Close()
	if p.whole {
		p.end(errDecodeDone, prefillGrace)
	} else {
		p.end(errDecodeFailed, 0) // decode broke off: nobody waits for the prefill's KV
	}
	return err
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

// withHeader returns leg with header name set to value on a copy of its headers (the
// request's forwarded set, shared by all its legs, is never edited).
func withHeader(leg gateway.Leg, name, value string) gateway.Leg {
	h := leg.Header.Clone()
	if h == nil {
		h = make(http.Header, 1)
	}
	h.Set(name, value)
	leg.Header = h
	return leg
}
