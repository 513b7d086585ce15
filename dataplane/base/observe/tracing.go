package observe

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// TracerName names the coordinator's instrumentation scope.
const TracerName = "github.com/epd-dev/coordinator"

// Propagator carries W3C trace context and baggage. It is used whether or not tracing is on, so
// a client's traceparent always reaches the workers.
var Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Telemetry bundles the metrics and the tracer handed to the server, the pipeline and its steps.
// The zero value records nothing but still propagates trace context.
type Telemetry struct {
	Metrics *Metrics
	Tracer  trace.Tracer
}

// Start opens a span; with tracing off it is a non-recording span that keeps the parent's
// trace context.
func (t Telemetry) Start(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if t.Tracer == nil {
		// Tracing off: no span, no allocation; the context keeps the client's trace for Inject.
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.Tracer.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// Extract reads the client's trace context from inbound headers.
func Extract(ctx context.Context, h http.Header) context.Context {
	return Propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject writes ctx's trace context (traceparent, tracestate, baggage) into outbound headers.
func Inject(ctx context.Context, h http.Header) {
	Propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// End finishes a span with an HTTP status (0 for none) and error.
func End(span trace.Span, status int, err error) {
	if !span.IsRecording() {
		return // tracing off (the span is the client's, or none): nothing to finish
	}
	if status != 0 {
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	span.End()
}

// NewTracerProvider builds an OTLP/HTTP exporting provider. endpoint is a URL such as
// http://otel-collector:4318 (empty: the OTEL_EXPORTER_OTLP_* environment, default
// localhost:4318); ratio is the parent-based sampling ratio for new traces. The resource is
// service's name and the OTEL_* environment (see newResource); a malformed
// OTEL_RESOURCE_ATTRIBUTES is an error.
func NewTracerProvider(ctx context.Context, endpoint, service string, ratio float64) (*sdktrace.TracerProvider, error) {
	res, err := newResource(ctx, service)
	if err != nil {
		return nil, err
	}
	var opts []otlptracehttp.Option
	if endpoint != "" {
		opts = append(opts, otlptracehttp.WithEndpointURL(endpoint))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, err
	}
	return newProvider(sdktrace.NewBatchSpanProcessor(exp), res, ratio), nil
}

// NewTracerProviderWith builds a provider around any span processor (tests use an in-memory one).
// Its resource is NewTracerProvider's; the well-formed pairs of a malformed
// OTEL_RESOURCE_ATTRIBUTES are kept.
func NewTracerProviderWith(sp sdktrace.SpanProcessor, service string, ratio float64) *sdktrace.TracerProvider {
	res, _ := newResource(context.Background(), service) // a partial resource is still usable
	return newProvider(sp, res, ratio)
}

func newProvider(sp sdktrace.SpanProcessor, res *resource.Resource, ratio float64) *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(sp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	)
}

// newResource is the tracer provider's resource, following the OpenTelemetry precedence:
// OTEL_SERVICE_NAME, when set, names the service, else service (tracing.service_name), which
// wins over a service.name in OTEL_RESOURCE_ATTRIBUTES; OTEL_RESOURCE_ATTRIBUTES adds its other
// attributes. (sdktrace.WithResource merges OTEL_RESOURCE_ATTRIBUTES under it again, to the same
// effect.) A malformed OTEL_RESOURCE_ATTRIBUTES returns the resource of its well-formed pairs
// with an error.
func newResource(ctx context.Context, service string) (*resource.Resource, error) {
	env, envErr := resource.New(ctx, resource.WithFromEnv())
	if name := strings.TrimSpace(os.Getenv("OTEL_SERVICE_NAME")); name != "" {
		service = name // as the SDK's environment detector reads it
	}
	res, err := resource.Merge(env, resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return res, err // a schema URL conflict, which cannot happen: neither side sets one
	}
	if envErr != nil {
		return res, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", envErr)
	}
	return res, nil
}

// Attribute keys used on coordinator spans.
var (
	AttrRequestID = attribute.Key("coordinator.request_id")
	AttrPhase     = attribute.Key("coordinator.phase")
	AttrStep      = attribute.Key("coordinator.step")
	AttrRevision  = attribute.Key("coordinator.config_revision")
	AttrModel     = attribute.Key("gen_ai.request.model")
	// AttrPipelineTrack and AttrPipelineRevision name the pipeline a request ran on.
	AttrPipelineTrack    = attribute.Key("coordinator.pipeline.track")
	AttrPipelineRevision = attribute.Key("coordinator.pipeline.revision")
)
