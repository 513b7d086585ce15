// Package steps holds the built-in pipeline steps, one per file, each registering itself with
// the builder (Caddy-style). A step is flow: it reads its params, asks the request's format for
// its legs (package wire), sends them through the gateway (package gateway) and relays the
// answer (package relay). This file has the params several steps share.
package steps

import (
	"cmp"
	"context"
	"net/http"

	"github.com/epd-dev/coordinator/dataplane/base/budget"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/connectors/ec"
	"github.com/epd-dev/coordinator/dataplane/connectors/kv"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/relay"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// Param names shared by several steps: the pipeline-level settings each step inherits.
const (
	paramKVConnector     = config.ParamKVConnector
	paramECConnector     = config.ParamECConnector
	paramUseOpenAIFormat = config.ParamUseOpenAIFormat
)

// kvConnector reads kv_connector (nil after an error, recorded on p).
func kvConnector(deps builder.Deps, p *params.Params) kv.Connector {
	name := p.String(paramKVConnector, kv.SharedStorage)
	c, err := kv.New(name, deps.Getenv)
	if err != nil {
		p.Fail(paramKVConnector, "%v", err)
	}
	return c
}

// ecConnector reads ec_connector (nil after an error, recorded on p).
func ecConnector(p *params.Params) ec.Connector {
	name := p.String(paramECConnector, ec.SharedStorage)
	c, err := ec.New(name)
	if err != nil {
		p.Fail(paramECConnector, "%v", err)
	}
	return c
}

// dataParallel reads data_parallel_size (≥ 1, default 1) for the step's KV connector c (nil when
// kv_connector was invalid, already reported): more than 1 is accepted with kv-nixl only.
func dataParallel(p *params.Params, c kv.Connector) kv.DataParallel {
	size := p.Int(kv.ParamDataParallelSize, 1, 1)
	if c == nil {
		return kv.DataParallel{}
	}
	dp, err := kv.NewDataParallel(c.Name(), size)
	if err != nil {
		p.Fail(kv.ParamDataParallelSize, "%v", err)
	}
	return dp
}

// onPoolFailure reads on_pool_failure (pipeline.on_pool_failure).
func onPoolFailure(deps builder.Deps, p *params.Params) retry.PoolPolicy {
	v := p.String(config.ParamOnPoolFailure, config.DefaultOnPoolFailure)
	switch v {
	case config.OnPoolFailureAggregate, config.OnPoolFailureFail:
	default:
		p.Fail(config.ParamOnPoolFailure, "must be %q or %q, got %q", config.OnPoolFailureAggregate, config.OnPoolFailureFail, v)
	}
	return retry.PoolPolicy{Aggregate: v == config.OnPoolFailureAggregate, Metrics: deps.Telemetry.Metrics}
}

// newAnswerer reads max_resumes: an answerer of the gateway's answers that resends a broken
// stream's continuation with resend, within the gateway's limits (what streams keep to be
// resumed from counted on deps.Shared.Resume, or on a count of the step's own).
func newAnswerer(deps builder.Deps, p *params.Params, resend func(ctx context.Context, rc *request.Context, cont *body.Object) (*http.Response, error)) relay.Answerer {
	a := relay.Answerer{MaxResumes: p.Int("max_resumes", relay.DefaultMaxResumes, 0), Metrics: deps.Telemetry.Metrics, Resend: resend}
	if gw := deps.Gateway; gw != nil {
		a.MaxResponse, a.Budget = gw.MaxResponseBytes(), gw.Retrier().Budget
		stream, process := gw.MaxResumeBytes()
		a.Limits = relay.Limits{MaxEvent: gw.MaxEventBytes(),
			Keep: wire.Keep{Max: stream, Held: cmp.Or(deps.Shared.Resume, &budget.Bytes{}), Limit: process}}
	}
	return a
}

// resendDecode is the resend of the decode steps: the continuation as a streamed decode leg,
// retried as gateway.Send does.
func resendDecode(gw *gateway.Client) func(ctx context.Context, rc *request.Context, cont *body.Object) (*http.Response, error) {
	return func(ctx context.Context, rc *request.Context, cont *body.Object) (*http.Response, error) {
		return gw.Send(ctx, rc.Log, func() (gateway.Leg, error) {
			leg := gateway.NewLeg(rc, gateway.ProfileDecode, rc.Path, cont).WithID("-resume")
			leg.Stream = true
			return leg, nil
		})
	}
}
