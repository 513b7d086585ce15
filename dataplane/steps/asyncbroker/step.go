// Package asyncbroker is the async-broker step: a bridge between the coordinator and an
// asynchronous request broker (llm-d-async) over Redis. It must be the first step of a pipeline.
//
// A request carrying the mode header (default X-AP-Mode) is handled by mode:
//   - passthrough: the tenant (X-Team) is classified against its reserved quota, the objective and
//     fairness headers are stamped on the forwarded headers, and the pipeline continues;
//   - enqueue: the request is stored durably in the tenant's route queue and answered with
//     202 {"id","status":"pending"}; the result is fetched later with GET /v1/requests/{id};
//   - wait: as enqueue, then the request is held until its result arrives, its deadline passes
//     (504), or wait_cap_seconds passes (202 pending).
//
// Requests without the header are untouched: that is also how the consumer re-enters the
// coordinator to run a queued request. The step serves GET and DELETE /v1/requests/{id} on the
// coordinator's listener.
//
// This package parses and validates the params and the requests; everything that talks to Redis
// is the Broker, provided by package dataplane/broker/redisbroker, which registers itself with Use when a
// binary imports it. The operator validates pipelines through this package and so links no Redis
// client. docs/async-broker.md documents the params and the Redis contract.
package asyncbroker

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// StepType is the registered type name.
const StepType = "async-broker"

func init() {
	registry.Register(registry.Type{Name: StepType, New: New,
		First: "it decides whether the request runs in this pipeline at all"})
}

// Request modes (the mode header's values, case-insensitive).
const (
	ModePassthrough = "passthrough"
	ModeEnqueue     = "enqueue"
	ModeWait        = "wait"
)

// Quota classes of passthrough requests.
const (
	ClassReserved = "reserved"
	ClassOverflow = "overflow"
)

// RequestsPath is the prefix of a queued request's URL, /v1/requests/{id}.
const RequestsPath = "/v1/requests/"

// validID is the shape of a request id (the server's x-request-id rule).
var validID = regexp.MustCompile(`^[A-Za-z0-9-]{1,128}$`)

var (
	_ pipeline.Closer        = (*Step)(nil)
	_ pipeline.RouteProvider = (*Step)(nil)
)

// Step is the async-broker step.
type Step struct {
	cfg *Settings
	log logr.Logger
	// broker is nil when the binary does not link the runtime.
	broker Broker
}

// New is the step factory. It validates the params (the builder checks that the step is first)
// and, when the binary links the runtime, builds the step's broker (which does no I/O either).
func New(deps registry.Deps, p *params.Params) (pipeline.Step, error) {
	return newStep(deps, p, registered())
}

func newStep(deps registry.Deps, p *params.Params, rt Runtime) (*Step, error) {
	cfg, err := ParseSettings(p)
	if err != nil {
		return nil, err
	}
	log := deps.Log
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	s := &Step{cfg: cfg, log: log}
	if rt != nil {
		if s.broker, err = rt(cfg, deps); err != nil {
			p.Fail("redis_url", "%v", err)
			return nil, p.Err()
		}
	}
	return s, nil
}

// Name is the registered type name.
func (*Step) Name() string { return StepType }

// Execute handles a request by its mode header; without one it does nothing.
func (s *Step) Execute(ctx context.Context, rc *request.Context) error {
	raw := strings.TrimSpace(rc.Header.Get(s.cfg.ModeHeader))
	if raw == "" {
		return nil
	}
	mode := strings.ToLower(raw)
	switch mode {
	case ModePassthrough, ModeEnqueue, ModeWait:
	default:
		return invalid("unknown %s %q: use passthrough, enqueue or wait", s.cfg.ModeHeader, truncate(raw, 64))
	}
	tenant, e := s.tenant(rc.Header)
	if e != nil {
		return e
	}
	if mode == ModePassthrough {
		return s.passthrough(ctx, rc, tenant)
	}
	if rc.Stream {
		e := invalid("stream is only supported in passthrough mode")
		e.Param = "stream"
		return e
	}
	if rc.Model == "" {
		e := invalid("model is required in %s mode (it selects the queue)", mode)
		e.Param = "model"
		return e
	}
	timeout, err := s.timeout(rc.Header, mode)
	if err != nil {
		return err
	}
	if s.broker == nil {
		return notLinked()
	}
	return s.broker.Queue(ctx, rc, tenant, mode, timeout)
}

// tenant reads the tenant header (default "default").
func (s *Step) tenant(h http.Header) (string, *apierror.Error) {
	t := strings.TrimSpace(h.Get(s.cfg.TenantHeader))
	switch {
	case t == "":
		return DefaultTenant, nil
	case strings.Contains(t, ":"):
		return "", invalid("%s must not contain ':'", s.cfg.TenantHeader)
	case len(t) > maxTenantLen:
		return "", invalid("%s is longer than %d bytes", s.cfg.TenantHeader, maxTenantLen)
	}
	return t, nil
}

// timeout is the request's time budget: the timeout header (positive whole seconds) or the
// mode's default, clamped to the mode's max_seconds.
func (s *Step) timeout(h http.Header, mode string) (time.Duration, error) {
	spec := s.cfg.Enqueue
	if mode == ModeWait {
		spec = s.cfg.Wait
	}
	d := spec.Default
	if v := strings.TrimSpace(h.Get(s.cfg.TimeoutHeader)); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n > 1<<31 {
			return 0, invalid("%s must be a positive whole number of seconds, got %q", s.cfg.TimeoutHeader, truncate(v, 32))
		}
		d = time.Duration(n) * time.Second
	}
	if spec.Max > 0 && d > spec.Max {
		d = spec.Max
	}
	return d, nil
}

// passthrough labels the request for the scheduler and lets the pipeline continue: the client's
// own objective and fairness headers are dropped, the tier's objective for the tenant's quota
// class and the tenant as fairness id are stamped on the forwarded headers.
func (s *Step) passthrough(ctx context.Context, rc *request.Context, tenant string) error {
	if s.broker == nil {
		return notLinked()
	}
	r := s.cfg.Route(rc.Model, tenant)
	class := ClassReserved
	if _, limited := s.cfg.Quota.Limit(tenant); limited {
		class = s.broker.Classify(ctx, rc.Log, tenant)
	}
	if rc.Forwarded == nil {
		rc.Forwarded = http.Header{}
	}
	h := rc.Forwarded
	h.Del(s.cfg.ModeHeader)
	h.Del(s.cfg.ObjectiveHeader)
	h.Del(s.cfg.FairnessHeader)
	if obj, ok := s.cfg.Objectives[r.Tier]; ok {
		name := obj.Reserved
		if class == ClassOverflow {
			name = obj.Overflow
		}
		if name != "" {
			h.Set(s.cfg.ObjectiveHeader, name)
		}
	}
	h.Set(s.cfg.FairnessHeader, tenant)
	rc.Log.V(logging.Verbose).Info("async-broker passthrough", "tenant", tenant, "tier", r.Tier, "class", class)
	return nil
}

// Routes serves the results of queued requests on the coordinator's listener:
// GET /v1/requests/{id} (the result, 202 while pending, 410 when unknown) and
// DELETE /v1/requests/{id} (cancel and forget, 204), both scoped to the caller's tenant, and,
// with serve_models, GET /v1/models listing the routes' models.
func (s *Step) Routes() []pipeline.Route {
	r := []pipeline.Route{
		{Pattern: "GET " + RequestsPath + "{id}", Handler: s.requestHandler(Broker.ServeResult)},
		{Pattern: "DELETE " + RequestsPath + "{id}", Handler: s.requestHandler(Broker.ServeDelete)},
	}
	if s.cfg.ServeModels {
		r = append(r, pipeline.Route{Pattern: "GET /v1/models", Handler: http.HandlerFunc(s.handleModels)})
	}
	return r
}

// requestHandler validates the id and tenant of a /v1/requests/{id} call and hands it to serve.
func (s *Step) requestHandler(serve func(b Broker, w http.ResponseWriter, r *http.Request, tenant, id string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqID := w.Header().Get(upstream.RequestIDHeader)
		id := r.PathValue("id")
		if id == "" {
			// Dispatched through ServeMux.Handler, which does not set path values.
			id = strings.TrimPrefix(r.URL.Path, RequestsPath)
		}
		if !validID.MatchString(id) {
			apierror.Write(w, invalid("invalid request id: 1 to 128 letters, digits or '-'"), reqID)
			return
		}
		tenant, e := s.tenant(r.Header)
		if e != nil {
			apierror.Write(w, e, reqID)
			return
		}
		if s.broker == nil {
			e := notLinked()
			s.log.Error(e.Cause, "async-broker: cannot serve "+r.Method+" "+RequestsPath+"{id}")
			apierror.Write(w, e, reqID)
			return
		}
		serve(s.broker, w, r, tenant, id)
	})
}

// handleModels lists the models named by routes.
func (s *Step) handleModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	seen := map[string]bool{}
	for _, r := range s.cfg.Routes {
		if r.Model == "" || r.Model == wildcard || seen[r.Model] {
			continue
		}
		seen[r.Model] = true
		out.Data = append(out.Data, model{ID: r.Model, Object: "model", OwnedBy: "llm-d-async"})
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(b, '\n'))
}

// Close releases the broker (requests still running keep working).
func (s *Step) Close() {
	if s.broker != nil {
		s.broker.Close()
	}
}

// invalid is a 400 with the upstream code.
func invalid(format string, args ...any) *apierror.Error {
	return &apierror.Error{Status: http.StatusBadRequest, Type: apierror.TypeInvalidRequest, Code: "INVALID_REQUEST", Message: fmt.Sprintf(format, args...)}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
