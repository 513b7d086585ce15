package observe

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func resourceAttrs(r *resource.Resource) map[string]string {
	m := map[string]string{}
	for _, kv := range r.Attributes() {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

func TestTracerResourceFromEnvironment(t *testing.T) {
	tests := map[string]struct {
		serviceName, attrs string
		want               map[string]string
		wantErr            string
	}{
		"configured name only": {want: map[string]string{"service.name": "configured"}},
		"OTEL_SERVICE_NAME wins over tracing.service_name": {serviceName: "from-env",
			want: map[string]string{"service.name": "from-env"}},
		"OTEL_RESOURCE_ATTRIBUTES adds attributes": {attrs: "deployment.environment.name=prod, k8s.pod.name=pod%201",
			want: map[string]string{"service.name": "configured", "deployment.environment.name": "prod", "k8s.pod.name": "pod 1"}},
		"tracing.service_name wins over service.name in OTEL_RESOURCE_ATTRIBUTES": {attrs: "service.name=attr,team=infer",
			want: map[string]string{"service.name": "configured", "team": "infer"}},
		"OTEL_SERVICE_NAME wins over both": {serviceName: "from-env", attrs: "service.name=attr,team=infer",
			want: map[string]string{"service.name": "from-env", "team": "infer"}},
		"blank OTEL_SERVICE_NAME is unset": {serviceName: "  ", want: map[string]string{"service.name": "configured"}},
		"malformed OTEL_RESOURCE_ATTRIBUTES keeps the well-formed pairs": {attrs: "team=infer,oops",
			want: map[string]string{"service.name": "configured", "team": "infer"}, wantErr: "OTEL_RESOURCE_ATTRIBUTES"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv("OTEL_SERVICE_NAME", tc.serviceName)
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", tc.attrs)
			res, err := newResource(context.Background(), "configured")
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
			if got := resourceAttrs(res); !equalMaps(got, tc.want) {
				t.Fatalf("resource %v, want %v", got, tc.want)
			}

			// The provider's spans carry that resource.
			rec := tracetest.NewSpanRecorder()
			tp := NewTracerProviderWith(rec, "configured", 1)
			_, span := tp.Tracer(TracerName).Start(context.Background(), "op")
			span.End()
			if got := resourceAttrs(rec.Ended()[0].Resource()); !equalMaps(got, tc.want) {
				t.Fatalf("span resource %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNewTracerProviderRejectsMalformedResourceAttributes(t *testing.T) {
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "team")
	tp, err := NewTracerProvider(context.Background(), "http://127.0.0.1:1", "coordinator", 1)
	if err == nil || !strings.Contains(err.Error(), "OTEL_RESOURCE_ATTRIBUTES") {
		t.Fatalf("error %v, want one naming OTEL_RESOURCE_ATTRIBUTES", err)
	}
	if tp != nil {
		t.Fatal("a provider was returned with the error")
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
