package steps

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"golang.org/x/sync/errgroup"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/connectors/ec"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// EncodeStep is the type name of the encoder fan-out.
const EncodeStep = "encode"

func init() {
	builder.Register(builder.Type{Name: EncodeStep, New: newEncode,
		Needs: []registry.Need{{Capability: registry.Tokens, Why: "it sends each item's mm_hash and placeholder"}}})
}

// encode sends one single-token leg per media item of any modality (image, audio, video;
// EPP-Profile: encode), at most maxParallel at once; the first failure cancels the others. The encoders' ec_transfer_params are merged, in
// item order, through the EC connector for the prefill leg.
type encode struct {
	gw          *gateway.Client
	ec          ec.Connector
	useOpenAI   bool
	maxParallel int
	metrics     *observe.Metrics
	pool        retry.PoolPolicy
}

func newEncode(deps builder.Deps, p *params.Params) (pipeline.Step, error) {
	deps.RequireGateway(p, EncodeStep)
	s := &encode{gw: deps.Gateway, ec: ecConnector(p), useOpenAI: p.Bool(paramUseOpenAIFormat, true), maxParallel: p.Int("max_parallel", 8, 1), metrics: deps.Telemetry.Metrics,
		pool: onPoolFailure(deps, p)}
	return s, nil
}

func (*encode) Name() string { return EncodeStep }

func (s *encode) Execute(ctx context.Context, rc *request.Context) error {
	if len(rc.Media) == 0 {
		return nil
	}
	path, item, err := wire.Of(rc.API).Legs(s.useOpenAI).Encoder(rc)
	if err != nil {
		return err
	}
	if path == "" {
		// The prefill worker encodes tokens-in requests inline (vllm-project/vllm#46722).
		rc.Log.V(logging.Debug).Info("skipping encode for a generate request")
		return nil
	}
	s.metrics.EncodeFanout(len(rc.Media))
	answers := make([]map[string]any, len(rc.Media))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.maxParallel)
	for i := range rc.Media {
		obj, err := item(i)
		if err != nil {
			return err
		}
		phase := "encode[" + strconv.Itoa(i) + "]"
		g.Go(func() error {
			out, err := s.gw.Fetch(gctx, rc.Log, gateway.Hinted(rc, gateway.ProfileEncode, i, func() (gateway.Leg, error) {
				return gateway.NewLeg(rc, gateway.ProfileEncode, path, obj).WithID("-encode-" + strconv.Itoa(i)), nil
			}))
			if up := (*apierror.UpstreamError)(nil); errors.As(err, &up) {
				up.Phase = phase // metrics and spans say encode; the error names the item
			}
			if err != nil {
				return err
			}
			var answer struct {
				EC json.RawMessage `json:"ec_transfer_params"`
			}
			if err := json.Unmarshal(out, &answer); err != nil {
				return &apierror.UpstreamError{Phase: phase, Status: 200, Body: upstream.Head(out), Err: fmt.Errorf("decoding answer: %w", err)}
			}
			if body.KindOf(answer.EC) == body.KindObject {
				if err := json.Unmarshal(answer.EC, &answers[i]); err != nil {
					return &apierror.UpstreamError{Phase: phase, Status: 200, Err: err}
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return s.pool.Handle(ctx, rc, EncodeStep, err)
	}
	if rc.ECParams == nil {
		rc.ECParams = map[string]any{}
	}
	for i, a := range answers {
		if len(a) == 0 {
			continue
		}
		if err := s.ec.Merge(rc.ECParams, a); err != nil {
			return &apierror.UpstreamError{Phase: "encode[" + strconv.Itoa(i) + "]", Status: 200, Err: err}
		}
	}
	rc.Log.V(logging.Debug).Info("encode complete", "items", len(rc.Media), "ec_descriptors", len(rc.ECParams))
	return nil
}
