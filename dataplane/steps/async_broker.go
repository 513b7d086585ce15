package steps

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/go-logr/logr"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/broker"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
)

// AsyncBrokerStep is the type name of the async-broker step.
const AsyncBrokerStep = broker.StepType

func init() {
	builder.Register(builder.Type{Name: AsyncBrokerStep, New: newAsyncBroker,
		First: "it decides whether the request runs in this pipeline at all"})
}

var (
	_ pipeline.Closer        = (*asyncBroker)(nil)
	_ pipeline.RouteProvider = (*asyncBroker)(nil)
)

// asyncBroker is a bridge between the coordinator and an asynchronous request broker
// (llm-d-async) over Redis. It must be the first step of a pipeline.
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
// coordinator's listener. Its params are package broker's Settings; everything that talks to
// Redis is the Broker that builder.Shared.Broker (the coordinator's redisbroker.Runtime) builds.
type asyncBroker struct {
	cfg *broker.Settings
	log logr.Logger
	// broker is nil when the process hands no runtime (the operator validates pipelines).
	broker broker.Broker
}

// newAsyncBroker validates the params (the builder checks that the step is first) and, when the
// process hands a runtime, builds the step's broker (which does no I/O either).
func newAsyncBroker(deps builder.Deps, p *params.Params) (pipeline.Step, error) {
	cfg, err := broker.ParseSettings(p)
	if err != nil {
		return nil, err
	}
	log := deps.Log
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	s := &asyncBroker{cfg: cfg, log: log}
	if rt := deps.Shared.Broker; rt != nil {
		if s.broker, err = rt(cfg, log, deps.Getenv); err != nil {
			p.Fail("redis_url", "%v", err)
			return nil, p.Err()
		}
	}
	return s, nil
}

func (*asyncBroker) Name() string { return AsyncBrokerStep }

// Execute handles a request by its mode header; without one it does nothing.
func (s *asyncBroker) Execute(ctx context.Context, rc *request.Context) error {
	raw := strings.TrimSpace(rc.Header.Get(s.cfg.ModeHeader))
	if raw == "" {
		return nil
	}
	mode := strings.ToLower(raw)
	switch mode {
	case broker.ModePassthrough, broker.ModeEnqueue, broker.ModeWait:
	default:
		return broker.Invalid("unknown %s %q: use passthrough, enqueue or wait", s.cfg.ModeHeader, broker.Truncate(raw, 64))
	}
	tenant, e := s.cfg.Tenant(rc.Header)
	if e != nil {
		return e
	}
	if mode == broker.ModePassthrough {
		return s.passthrough(ctx, rc, tenant)
	}
	if rc.Stream {
		e := broker.Invalid("stream is only supported in passthrough mode")
		e.Param = "stream"
		return e
	}
	if rc.Model == "" {
		e := broker.Invalid("model is required in %s mode (it selects the queue)", mode)
		e.Param = "model"
		return e
	}
	timeout, err := s.cfg.Timeout(rc.Header, mode)
	if err != nil {
		return err
	}
	if s.broker == nil {
		return notLinked()
	}
	if err := s.broker.Queue(ctx, rc, tenant, mode, timeout); err != nil {
		return err
	}
	return pipeline.ErrDone // the broker answered
}

// passthrough labels the request for the scheduler and lets the pipeline continue: the client's
// own objective and fairness headers are dropped, the tier's objective for the tenant's quota
// class and the tenant as fairness id are stamped on the forwarded headers.
func (s *asyncBroker) passthrough(ctx context.Context, rc *request.Context, tenant string) error {
	if s.broker == nil {
		return notLinked()
	}
	r := s.cfg.Route(rc.Model, tenant)
	class := broker.ClassReserved
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
		if class == broker.ClassOverflow {
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
func (s *asyncBroker) Routes() []pipeline.Route {
	r := []pipeline.Route{
		{Pattern: "GET " + broker.RequestsPath + "{id}", Handler: s.requestHandler(broker.Broker.ServeResult)},
		{Pattern: "DELETE " + broker.RequestsPath + "{id}", Handler: s.requestHandler(broker.Broker.ServeDelete)},
	}
	if s.cfg.ServeModels {
		r = append(r, pipeline.Route{Pattern: "GET /v1/models", Handler: http.HandlerFunc(s.handleModels)})
	}
	return r
}

// requestHandler validates the id and tenant of a /v1/requests/{id} call and hands it to serve.
func (s *asyncBroker) requestHandler(serve func(b broker.Broker, w http.ResponseWriter, r *http.Request, tenant, id string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqID := w.Header().Get(upstream.RequestIDHeader)
		id := r.PathValue("id")
		if id == "" {
			// Dispatched through ServeMux.Handler, which does not set path values.
			id = strings.TrimPrefix(r.URL.Path, broker.RequestsPath)
		}
		if !broker.ValidID(id) {
			apierror.Write(w, broker.Invalid("invalid request id: 1 to 128 letters, digits or '-'"), reqID)
			return
		}
		tenant, e := s.cfg.Tenant(r.Header)
		if e != nil {
			apierror.Write(w, e, reqID)
			return
		}
		if s.broker == nil {
			e := notLinked()
			s.log.Error(e.Cause, "async-broker: cannot serve "+r.Method+" "+broker.RequestsPath+"{id}")
			apierror.Write(w, e, reqID)
			return
		}
		serve(s.broker, w, r, tenant, id)
	})
}

// handleModels lists the models named by routes.
func (s *asyncBroker) handleModels(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, m := range s.cfg.Models() {
		out.Data = append(out.Data, model{ID: m, Object: "model", OwnedBy: "llm-d-async"})
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(append(b, '\n'))
}

// Close releases the broker (requests still running keep working).
func (s *asyncBroker) Close() {
	if s.broker != nil {
		s.broker.Close()
	}
}

// errNotLinked is the cause of the 500 a step without a runtime answers.
var errNotLinked = errors.New("the async-broker step was built without its Redis runtime: the process hands " + broker.RuntimePackage +
	"'s Runtime to the pipelines it builds (builder.Shared.Broker)")

// notLinked is the answer of a step without a runtime.
func notLinked() *apierror.Error {
	return &apierror.Error{Status: http.StatusInternalServerError, Type: apierror.TypeAPI, Code: "BROKER_NOT_LINKED",
		Message: "the async broker is not available in this build of the coordinator", Cause: errNotLinked}
}
