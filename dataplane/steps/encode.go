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
	"github.com/epd-dev/coordinator/dataplane/connectors/ec"
	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/pipeline/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
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
	pool        poolPolicy
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
	if rc.API == request.APIGenerate {
		// The prefill worker encodes tokens-in requests inline (vllm-project/vllm#46722).
		rc.Log.V(logging.Debug).Info("skipping encode for a generate request")
		return nil
	}
	format := rc.API.Format(s.useOpenAI)
	if format == request.APIResponses {
		format = request.APIChat // an encode leg is one media part: the chat shape
	}
	s.metrics.EncodeFanout(len(rc.Media))
	var msgs []json.RawMessage
	if format == request.APIChat {
		raw, _ := rc.Body.Get(rc.API.MessagesKey())
		msgs, _ = body.Array(raw)
	}
	answers := make([]map[string]any, len(rc.Media))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.maxParallel)
	for i := range rc.Media {
		obj, err := s.body(rc, format, msgs, i)
		if err != nil {
			return err
		}
		phase := "encode[" + strconv.Itoa(i) + "]"
		g.Go(func() error {
			out, err := s.gw.Fetch(gctx, rc.Log, hinted(rc, gateway.ProfileEncode, i, func() (gateway.Leg, error) {
				return rc.Leg(gateway.ProfileEncode, format.Path(), obj), nil
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
				return &apierror.UpstreamError{Phase: phase, Status: 200, Body: head(out), Err: fmt.Errorf("decoding answer: %w", err)}
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
		return s.pool.handle(ctx, rc, EncodeStep, err)
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

// body builds the leg of item i: its own media part (an input_audio's {"data", "format"}, another
// kind's {"url", ...}) plus its tokens, [BOS] + [P]*length with the placeholder at offset 1 and P
// its modality's placeholder token (chat), or token_ids and features with kwargs_data keyed by its
// modality (generate).
func (s *encode) body(rc *request.Context, format request.API, msgs []json.RawMessage, i int) (*body.Object, error) {
	m := rc.Media[i]
	bos, ph := 1, 0
	if len(rc.TokenIDs) > 0 {
		bos = rc.TokenIDs[0]
	}
	if m.Placeholder.Offset >= 0 && m.Placeholder.Offset < len(rc.TokenIDs) {
		ph = rc.TokenIDs[m.Placeholder.Offset]
	}
	ids := make([]byte, 0, 8*m.Placeholder.Length+16)
	ids = append(ids, '[')
	ids = strconv.AppendInt(ids, int64(bos), 10)
	for k := 0; k < m.Placeholder.Length; k++ {
		ids = append(ids, ',')
		ids = strconv.AppendInt(ids, int64(ph), 10)
	}
	ids = append(ids, ']')
	single := []request.MediaEntry{{Kind: m.Kind, Hash: m.Hash, Placeholder: request.Placeholder{Offset: 1, Length: m.Placeholder.Length}, Kwargs: m.Kwargs}}

	obj := &body.Object{}
	if raw, ok := rc.Body.Get("model"); ok {
		obj.Set("model", raw)
	}
	if format == request.APIGenerate {
		obj.Set("token_ids", ids)
		obj.Set("features", featuresJSON(single, mmKwargs))
		obj.Set("sampling_params", json.RawMessage(`{"max_tokens":1}`))
		obj.Set("stream", jsonFalse)
		return obj, nil
	}
	part, err := media.Part(msgs, &m)
	if err != nil {
		part = json.RawMessage(`{"url":""}`)
	}
	head := make([]byte, 0, 96)
	head = append(head, `[{"role":"user","content":[{"type":`...)
	head = body.AppendQuote(head, m.Kind)
	head = append(head, ',')
	head = body.AppendQuote(head, media.Field(m.Kind))
	head = append(head, ':')
	// The media part (a data: URL, possibly megabytes) is streamed from the client's body, not copied.
	obj.SetSegments("messages", head, part, []byte("}]}]"))
	tokens := make([]byte, 0, len(ids)+128)
	tokens = append(tokens, `{"token_ids":`...)
	tokens = append(tokens, ids...)
	tokens = append(tokens, `,"features":`...)
	tokens = append(tokens, featuresJSON(single, mmNone)...)
	tokens = append(tokens, '}')
	obj.Set("tokens", tokens)
	obj.Set("max_tokens", jsonOne)
	obj.Set("stream", jsonFalse)
	return obj, nil
}
