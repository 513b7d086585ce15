package controller

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// The API server rejects what the CRD schema and its CEL rules forbid, with these messages.
func TestCRDValidationRejects(t *testing.T) {
	e := envSuite(t)
	ns := e.namespace(t)
	steps := func(types ...coordinatorv1alpha1.StepType) []coordinatorv1alpha1.PipelineStep {
		out := make([]coordinatorv1alpha1.PipelineStep, len(types))
		for i, ty := range types {
			out[i] = coordinatorv1alpha1.PipelineStep{Type: ty}
		}
		return out
	}
	const (
		prefill = coordinatorv1alpha1.StepPrefill
		decode  = coordinatorv1alpha1.StepDecode
	)
	tests := map[string]struct {
		mutate  func(*coordinatorv1alpha1.CoordinatorPipeline)
		wantErr string
	}{
		"address and gatewayRef": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.GatewayRef = &coordinatorv1alpha1.GatewayReference{Name: "gw"}
			},
			wantErr: `spec.gateway: Invalid value: exactly one of address or gatewayRef must be set`,
		},
		"neither address nor gatewayRef": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Gateway = coordinatorv1alpha1.GatewaySpec{} },
			wantErr: `spec.gateway: Invalid value: exactly one of address or gatewayRef must be set`,
		},
		"address is not an http URL": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Gateway.Address = "inference-gateway:80" },
			wantErr: `spec.gateway.address: Invalid value: "inference-gateway:80": address must be an http:// or https:// URL with a host`,
		},
		"rate limit without a tenant header": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.RateLimit = &coordinatorv1alpha1.RateLimitSpec{RedisURL: "redis://redis:6379"}
			},
			wantErr: `spec.rateLimit: Invalid value: rateLimit needs the tenant header`,
		},
		"rate limit with an http URL": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.RateLimit = &coordinatorv1alpha1.RateLimitSpec{RedisURL: "http://redis:6379", TenantHeader: "x-team"}
			},
			wantErr: `spec.rateLimit.redisURL: Invalid value: "http://redis:6379"`,
		},
		"rate limit tenant named *": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.RateLimit = &coordinatorv1alpha1.RateLimitSpec{RedisURL: "redis://redis:6379", TenantHeader: "x-team",
					Tenants: []coordinatorv1alpha1.TenantSpec{{Name: "*"}}}
			},
			wantErr: `* is the bucket of the tenants not listed: use default`,
		},
		"rate limit failure mode": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.RateLimit = &coordinatorv1alpha1.RateLimitSpec{RedisURL: "redis://redis:6379", TenantHeader: "x-team", OnRedisFailure: "maybe"}
			},
			wantErr: `spec.rateLimit.onRedisFailure: Unsupported value: "maybe"`,
		},
		"no steps": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.Steps = []coordinatorv1alpha1.PipelineStep{}
			},
			wantErr: `spec.pipeline.steps: Invalid value: at least one step is required; a pipeline ends with decode`,
		},
		"decode not last": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Pipeline.Steps = steps(decode, prefill) },
			wantErr: `spec.pipeline.steps: Invalid value: the last step must be decode or prefill-decode`,
		},
		"prefill-decode with decode": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.Steps = steps(decode, coordinatorv1alpha1.StepPrefillDecode)
			},
			wantErr: `spec.pipeline.steps: Invalid value: prefill-decode replaces prefill and decode: a pipeline has one or the other`,
		},
		"kv-sglang with prefill": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.KVConnector = coordinatorv1alpha1.KVConnectorSGLang
			},
			wantErr: `spec.pipeline: Invalid value: kvConnector kv-sglang needs the prefill-decode step in place of prefill and decode`,
		},
		"decode twice": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.Steps = steps(decode, prefill, decode)
			},
			wantErr: `spec.pipeline.steps: Invalid value: step type decode appears more than once; each step type may appear at most once`,
		},
		"duplicate prefill": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.Steps = steps(prefill, prefill, decode)
			},
			wantErr: `spec.pipeline.steps: Invalid value: step type prefill appears more than once; each step type may appear at most once`,
		},
		"unknown step type": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Pipeline.Steps = steps("teleport", decode) },
			wantErr: `spec.pipeline.steps[0].type: Unsupported value: "teleport": supported values: "async-broker", "replace-media-urls", "render", "conditional-decode", "encode", "prefill", "decode"`,
		},
		"async-broker not first": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.Steps = steps(prefill, coordinatorv1alpha1.StepAsyncBroker, decode)
			},
			wantErr: `spec.pipeline.steps: Invalid value: async-broker must be the first step`,
		},
		"tokens-in without render": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.UseOpenAIFormat = ptr.To(false)
			},
			wantErr: `spec.pipeline: Invalid value: useOpenAIFormat=false (tokens-in legs) requires a render step`,
		},
		"unknown kv connector": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Pipeline.KVConnector = "kv-bogus" },
			wantErr: `spec.pipeline.kvConnector: Unsupported value: "kv-bogus": supported values: "kv-nixl", "kv-sglang", "kv-shared-storage"`,
		},
		"unknown pool failure policy": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Pipeline.OnPoolFailure = "retry" },
			wantErr: `spec.pipeline.onPoolFailure: Unsupported value: "retry": supported values: "aggregate", "fail"`,
		},
		"retry maxAttempts 0": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{MaxAttempts: ptr.To[int32](0)}
			},
			wantErr: `spec.gateway.retry.maxAttempts: Invalid value: 0: spec.gateway.retry.maxAttempts in body should be greater than or equal to 1`,
		},
		"profile header with a space": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.ProfileHeaders = []string{"epp profile"}
			},
			wantErr: `spec.gateway.profileHeaders[0]: Invalid value: "epp profile": spec.gateway.profileHeaders[0] in body should match '^[A-Za-z0-9][-A-Za-z0-9]*$'`,
		},
		"forwarded header listed twice": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.ForwardResponseHeaders = []string{"x-a", "x-a"}
			},
			wantErr: `spec.pipeline.forwardResponseHeaders[1]: Duplicate value: "x-a"`,
		},
		"retry maxRetriesPerRequest 101": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{MaxRetriesPerRequest: ptr.To[int32](101)}
			},
			wantErr: `spec.gateway.retry.maxRetriesPerRequest: Invalid value: 101: spec.gateway.retry.maxRetriesPerRequest in body should be less than or equal to 100`,
		},
		"retry maxAttempts 11": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{MaxAttempts: ptr.To[int32](11)}
			},
			wantErr: `spec.gateway.retry.maxAttempts: Invalid value: 11: spec.gateway.retry.maxAttempts in body should be less than or equal to 10`,
		},
		"retry budgetPercent 101": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{BudgetPercent: ptr.To[int32](101)}
			},
			wantErr: `spec.gateway.retry.budgetPercent: Invalid value: 101: spec.gateway.retry.budgetPercent in body should be less than or equal to 100`,
		},
		"retry budgetMinPerSecond negative": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{BudgetMinPerSecond: ptr.To[int32](-1)}
			},
			wantErr: `spec.gateway.retry.budgetMinPerSecond: Invalid value: -1: spec.gateway.retry.budgetMinPerSecond in body should be greater than or equal to 0`,
		},
		"retry maxBackoff below initialBackoff": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{InitialBackoff: duration("1s"), MaxBackoff: duration("999ms")}
			},
			wantErr: `spec.gateway.retry: Invalid value: maxBackoff must not be below initialBackoff`,
		},
		"maxResponseSizeMiB 0": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.MaxResponseSizeMiB = ptr.To[int32](0)
			},
			wantErr: `spec.gateway.maxResponseSizeMiB: Invalid value: 0: spec.gateway.maxResponseSizeMiB in body should be greater than or equal to 1`,
		},
		"maxResponseSizeMiB above 64 GiB": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.MaxResponseSizeMiB = ptr.To[int32](65537)
			},
			wantErr: `spec.gateway.maxResponseSizeMiB: Invalid value: 65537: spec.gateway.maxResponseSizeMiB in body should be less than or equal to 65536`,
		},
		"params not an object": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Pipeline.Steps[1].Params = &apiextensionsv1.JSON{Raw: []byte(`"max_parallel=4"`)}
			},
			wantErr: `spec.pipeline.steps[1].params: Invalid value: "string": spec.pipeline.steps[1].params in body must be of type object`,
		},
		"log level above 5": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.LogLevel = 6 },
			wantErr: `spec.logLevel: Invalid value: 6: spec.logLevel in body should be less than or equal to 5`,
		},
		"negative replicas": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Replicas = ptr.To[int32](-1) },
			wantErr: `spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0`,
		},
		"route without a Gateway to attach to": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Route = &coordinatorv1alpha1.RouteSpec{} },
			wantErr: `spec: Invalid value: route needs a Gateway to attach to: set route.parentRef or gateway.gatewayRef`,
		},
		"route with an unknown match type": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Route = &coordinatorv1alpha1.RouteSpec{ParentRef: &coordinatorv1alpha1.RouteParentReference{Name: "gw"}, EPPProfileMatch: "Present"}
			},
			wantErr: `spec.route.eppProfileMatch: Unsupported value: "Present": supported values: "Exact", "RegularExpression"`,
		},
		"route timeout is not a Gateway API duration": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Route = &coordinatorv1alpha1.RouteSpec{ParentRef: &coordinatorv1alpha1.RouteParentReference{Name: "gw"}, RequestTimeout: "1.5m"}
			},
			wantErr: `spec.route.requestTimeout: Invalid value: "1.5m": spec.route.requestTimeout in body should match`,
		},
		"autoscaling min above max": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Autoscaling = &coordinatorv1alpha1.AutoscalingSpec{MinReplicas: ptr.To[int32](4), MaxReplicas: 3, TargetInFlightRequests: ptr.To[int32](8)}
			},
			wantErr: `spec.autoscaling: Invalid value: minReplicas must not be above maxReplicas`,
		},
		"autoscaling min 0": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Autoscaling = &coordinatorv1alpha1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 3, TargetInFlightRequests: ptr.To[int32](8)}
			},
			wantErr: `spec.autoscaling.minReplicas: Invalid value: 0: spec.autoscaling.minReplicas in body should be greater than or equal to 1`,
		},
		"autoscaling max 0": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Autoscaling = &coordinatorv1alpha1.AutoscalingSpec{TargetInFlightRequests: ptr.To[int32](8)}
			},
			wantErr: `spec.autoscaling.maxReplicas: Invalid value: 0: spec.autoscaling.maxReplicas in body should be greater than or equal to 1`,
		},
		"autoscaling without a target": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Autoscaling = &coordinatorv1alpha1.AutoscalingSpec{MaxReplicas: 3}
			},
			wantErr: `spec.autoscaling: Invalid value: set targetCPUUtilizationPercent, targetInFlightRequests or both: the autoscaler needs a target`,
		},
		"autoscaling with a target of 0": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Autoscaling = &coordinatorv1alpha1.AutoscalingSpec{MaxReplicas: 3, TargetCPUUtilizationPercent: ptr.To[int32](0)}
			},
			wantErr: `spec.autoscaling.targetCPUUtilizationPercent: Invalid value: 0: spec.autoscaling.targetCPUUtilizationPercent in body should be greater than or equal to 1`,
		},
		"autoscaling with a negative in-flight target": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Autoscaling = &coordinatorv1alpha1.AutoscalingSpec{MaxReplicas: 3, TargetInFlightRequests: ptr.To[int32](-2)}
			},
			wantErr: `spec.autoscaling.targetInFlightRequests: Invalid value: -2: spec.autoscaling.targetInFlightRequests in body should be greater than or equal to 1`,
		},
		"autoscaling metric name that is no metric name": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Autoscaling = &coordinatorv1alpha1.AutoscalingSpec{MaxReplicas: 3, TargetInFlightRequests: ptr.To[int32](2), InFlightMetricName: "in flight"}
			},
			wantErr: `spec.autoscaling.inFlightMetricName: Invalid value: "in flight": spec.autoscaling.inFlightMetricName in body should match`,
		},
		"disruption budget with both bounds": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.DisruptionBudget = &coordinatorv1alpha1.DisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), MaxUnavailable: ptr.To(intstr.FromInt32(1))}
			},
			wantErr: `spec.disruptionBudget: Invalid value: set at most one of minAvailable and maxUnavailable`,
		},
		"disruption budget above 100%": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.DisruptionBudget = &coordinatorv1alpha1.DisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromString("150%"))}
			},
			wantErr: `spec.disruptionBudget.minAvailable: Invalid value: "150%": must be a non-negative integer or a percentage such as 50%`,
		},
		"negative disruption budget": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.DisruptionBudget = &coordinatorv1alpha1.DisruptionBudgetSpec{MaxUnavailable: ptr.To(intstr.FromInt32(-1))}
			},
			wantErr: `spec.disruptionBudget.maxUnavailable: Invalid value: -1: must be a non-negative integer or a percentage such as 25%`,
		},
		"network policy gateway port out of range": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.NetworkPolicy = &coordinatorv1alpha1.NetworkPolicySpec{Enabled: true, Egress: &coordinatorv1alpha1.NetworkPolicyEgress{GatewayPorts: []int32{0}}}
			},
			wantErr: `spec.networkPolicy.egress.gatewayPorts[0]: Invalid value: 0: spec.networkPolicy.egress.gatewayPorts[0] in body should be greater than or equal to 1`,
		},
		"canary weight above 100": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: 101, Pipeline: coordinatorv1alpha1.PipelineSpec{Steps: steps(decode)}}
			},
			wantErr: `spec.canary.weightPercent: Invalid value: 101: spec.canary.weightPercent in body should be less than or equal to 100`,
		},
		"canary weight negative": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: -1, Pipeline: coordinatorv1alpha1.PipelineSpec{Steps: steps(decode)}}
			},
			wantErr: `spec.canary.weightPercent: Invalid value: -1: spec.canary.weightPercent in body should be greater than or equal to 0`,
		},
		"canary pipeline follows the pipeline's rules": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: 5, Pipeline: coordinatorv1alpha1.PipelineSpec{Steps: steps(decode, prefill)}}
			},
			wantErr: `spec.canary.pipeline.steps: Invalid value: the last step must be decode or prefill-decode`,
		},
		"canary with kv-sglang and prefill": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: 5, Pipeline: coordinatorv1alpha1.PipelineSpec{KVConnector: "kv-sglang", Steps: steps(prefill, decode)}}
			},
			wantErr: `spec.canary.pipeline: Invalid value: kvConnector kv-sglang needs the prefill-decode step`,
		},
		"name is not a DNS-1035 label": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Name = "1-epd" },
			wantErr: `metadata.name must be a DNS-1035 label`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline(ns, "cel")
			cp.UID, cp.Generation = "", 0
			tc.mutate(cp)
			err := e.client.Create(context.Background(), cp)
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(ContainSubstring(tc.wantErr))
		})
	}

	// A duration without a unit cannot be written from Go (metav1.Duration); send it raw.
	t.Run("duration without a unit", func(t *testing.T) {
		g := NewWithT(t)
		cp := newPipeline(ns, "cel")
		cp.UID, cp.Generation = "", 0
		obj, err := toUnstructured(cp)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(unstructured.SetNestedField(obj.Object, "30", "spec", "server", "readTimeout")).To(Succeed())
		err = e.client.Create(context.Background(), obj)
		g.Expect(err).To(HaveOccurred())
		g.Expect(err.Error()).To(ContainSubstring(`spec.server.readTimeout: Invalid value: "30": spec.server.readTimeout in body should match`))
	})
}

func toUnstructured(cp *coordinatorv1alpha1.CoordinatorPipeline) (*unstructured.Unstructured, error) {
	cp.APIVersion, cp.Kind = coordinatorv1alpha1.GroupVersion.String(), "CoordinatorPipeline"
	b, err := yaml.Marshal(cp)
	if err != nil {
		return nil, err
	}
	obj := &unstructured.Unstructured{}
	return obj, yaml.Unmarshal(b, &obj.Object)
}

// The sample in config/samples is accepted by the API server and its pipeline builds.
func TestSampleIsValid(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	data, err := os.ReadFile("../../config/samples/coordinator_v1alpha1_coordinatorpipeline.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	cp := &coordinatorv1alpha1.CoordinatorPipeline{}
	g.Expect(yaml.UnmarshalStrict(data, cp)).To(Succeed())
	cp.Namespace = ns
	e.createPool(t, ns, cp.Spec.InferencePoolRef.Name)
	g.Expect(e.client.Create(context.Background(), cp)).To(Succeed())
	e.reconciled(g, ns, cp.Name, func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonDeploymentNotReady)
	})
}

// The kustomize tree (config/default) builds, and the API server accepts every object in it
// (server-side apply, dry run): RBAC, the manager Deployment, the metrics Service and the CRD.
func TestInstallManifestsApply(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	out, err := exec.Command(filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl"), "kustomize", "../../config/default").Output()
	g.Expect(err).NotTo(HaveOccurred(), "kubectl kustomize config/default")

	kinds := map[string]int{}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		obj := &unstructured.Unstructured{}
		g.Expect(yaml.Unmarshal([]byte(doc), &obj.Object)).To(Succeed())
		if obj.GetKind() == "" {
			continue
		}
		kinds[obj.GetKind()]++
		opts := []client.ApplyOption{client.FieldOwner("manifest-test"), client.ForceOwnership}
		if obj.GetKind() != "Namespace" { // namespaced objects need it for real
			opts = append(opts, client.DryRunAll)
		}
		g.Expect(e.client.Apply(ctx, client.ApplyConfigurationFromUnstructured(obj), opts...)).
			To(Succeed(), "%s %s", obj.GetKind(), obj.GetName())
	}
	g.Expect(kinds).To(Equal(map[string]int{
		"Namespace": 1, "CustomResourceDefinition": 1, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1,
		"ClusterRole": 6, "ClusterRoleBinding": 2, "Service": 1, "Deployment": 1,
	}))
}

// The API server refuses a gateway address at the pod itself, at a cloud instance metadata
// service, or in a form that could hide one, naming the field and the reason; ordinary cluster,
// private and external addresses pass.
func TestGatewayAddressRefusesLocalAndMetadataHosts(t *testing.T) {
	e := envSuite(t)
	ns := e.namespace(t)
	const (
		unspec    = "address host must not be an unspecified address (0.0.0.0/8, ::)"
		linkLocal = "address host must not be link-local (169.254.0.0/16, fe80::/10): cloud instance metadata services listen there"
		metadata  = "address host must not be a cloud instance metadata service (100.100.100.200, fd00:ec2::254)"
		names     = "address host must not be a cloud instance metadata service name (metadata, metadata.google.internal)"
		canonical = "address host must be a DNS name or an IP address in canonical form"
	)
	tests := map[string]struct {
		address string
		wantErr string // "" accepts
	}{
		"AWS, Azure, GCP, OpenStack metadata": {"http://169.254.169.254/latest/meta-data", linkLocal},
		"ECS task metadata":                   {"http://169.254.170.2:80", linkLocal},
		"IPv6 link-local":                     {"http://[fe80::a9fe:a9fe]:80", linkLocal},
		"AWS IMDS over IPv6":                  {"http://[fd00:ec2::254]", metadata},
		"Alibaba Cloud metadata":              {"http://100.100.100.200", metadata},
		"GCP metadata name":                   {"http://metadata.google.internal/computeMetadata/v1", names},
		"GCP metadata name, FQDN, upper case": {"http://METADATA.google.internal.:80", names},
		"GCP metadata short name":             {"http://metadata", names},
		"localhost (a gateway sidecar)":       {"http://localhost:8080", ""},
		"IPv4 loopback":                       {"http://127.0.0.1:8080", ""},
		"IPv6 loopback":                       {"http://[::1]:8080", ""},
		"unspecified IPv4":                    {"http://0.0.0.0:80", unspec},
		"this network":                        {"http://0.1.2.3", unspec},
		"unspecified IPv6":                    {"http://[::]:80", unspec},
		"IPv4-mapped IPv6 metadata":           {"http://[::ffff:169.254.169.254]", canonical},
		"IPv6 with a zone":                    {"http://[fe80::1%25eth0]", canonical},
		"decimal IPv4":                        {"http://2852039166", canonical},
		"octal IPv4":                          {"http://0251.0376.0251.0376", canonical},
		"hexadecimal IPv4":                    {"http://0xa9fea9fe", canonical},
		"short IPv4":                          {"http://169.254.43518", canonical},
		"user information":                    {"http://gw@169.254.169.254/", canonical},
		"percent-encoded host":                {"http://%31%36%39.254.169.254", canonical},
		"upper-case scheme":                   {"HTTP://169.254.169.254", "address must be an http:// or https:// URL with a host"},
		"cluster Service":                     {"http://inference-gateway.infra.svc.cluster.local:80", ""},
		"private IPv4":                        {"http://10.96.0.10:80", ""},
		"unique local IPv6":                   {"https://[fd00::10]:443", ""},
		"external name starting with digits":  {"https://1e100.example.com", ""},
		"CGNAT neighbour of the metadata IP":  {"http://100.100.100.201", ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline(ns, "gw-address")
			cp.UID, cp.Generation = "", 0
			cp.Spec.Gateway.Address = tc.address
			err := e.client.Create(context.Background(), cp, client.DryRunAll)
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(ContainSubstring(`spec.gateway.address: Invalid value: "` + tc.address + `": ` + tc.wantErr))
		})
	}
}

// The API server accepts the gateway retry and pool failure settings within their bounds; its CEL
// rule compares the two backoffs as durations (whatever their units) only when both are set,
// leaving a single one against the other's default to the data plane's validation.
func TestRetrySettingsAccepted(t *testing.T) {
	e := envSuite(t)
	ns := e.namespace(t)
	tests := map[string]func(*coordinatorv1alpha1.CoordinatorPipeline){
		"every field at its lower bound": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway.IdleTimeout, cp.Spec.Gateway.RequestTimeout = duration("0s"), duration("0s")
			cp.Spec.Gateway.MaxResponseSizeMiB = ptr.To[int32](1)
			cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{
				MaxAttempts: ptr.To[int32](1), InitialBackoff: duration("0s"), MaxBackoff: duration("0s"),
				MaxRetryAfter: duration("0s"), BudgetPercent: ptr.To[int32](0), BudgetMinPerSecond: ptr.To[int32](0),
			}
			cp.Spec.Pipeline.OnPoolFailure = coordinatorv1alpha1.PoolFailureAggregate
		},
		"every field at its upper bound": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway.MaxResponseSizeMiB = ptr.To[int32](65536)
			cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{
				MaxAttempts: ptr.To[int32](10), BudgetPercent: ptr.To[int32](100), BudgetMinPerSecond: ptr.To[int32](1000000),
			}
			cp.Spec.Pipeline.OnPoolFailure = coordinatorv1alpha1.PoolFailureFail
		},
		"equal backoffs": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{InitialBackoff: duration("250ms"), MaxBackoff: duration("250ms")}
		},
		"only maxBackoff": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{MaxBackoff: duration("10ms")}
		},
		"only initialBackoff": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{InitialBackoff: duration("1m")}
		},
		"an empty retry": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{}
		},
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline(ns, "retry")
			cp.UID, cp.Generation = "", 0
			mutate(cp)
			g.Expect(e.client.Create(context.Background(), cp, client.DryRunAll)).To(Succeed())
		})
	}

	// Durations in other units than Go prints them: the rule compares values, not strings.
	for name, tc := range map[string]struct {
		initial, maxBackoff string
		wantErr             bool
	}{
		"1500us and 1.5ms":  {initial: "1500us", maxBackoff: "1.5ms"},
		"1500µs and 1ms":    {initial: "1500µs", maxBackoff: "1ms", wantErr: true},
		"61m and 1h":        {initial: "61m", maxBackoff: "1h", wantErr: true},
		"1h and 1h0m0.001s": {initial: "1h", maxBackoff: "1h0m0.001s"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline(ns, "retry")
			cp.UID, cp.Generation = "", 0
			obj, err := toUnstructured(cp)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(unstructured.SetNestedField(obj.Object, map[string]any{"initialBackoff": tc.initial, "maxBackoff": tc.maxBackoff},
				"spec", "gateway", "retry")).To(Succeed())
			err = e.client.Create(context.Background(), obj, client.DryRunAll)
			if !tc.wantErr {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(ContainSubstring(`spec.gateway.retry: Invalid value: maxBackoff must not be below initialBackoff`))
		})
	}
}

// The API server refuses TLS settings that would not do what they say.
func TestTLSValidationRejects(t *testing.T) {
	e := envSuite(t)
	ns := e.namespace(t)
	tests := map[string]struct {
		mutate  func(*coordinatorv1alpha1.CoordinatorPipeline)
		wantErr string
	}{
		"TLS 1.0": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "tls", MinVersion: "VersionTLS10"}
			},
			wantErr: `spec.server.tls.minVersion: Unsupported value: "VersionTLS10": supported values: "VersionTLS12", "VersionTLS13"`,
		},
		"an insecure cipher suite": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "tls", CipherSuites: []coordinatorv1alpha1.TLSCipherSuite{"TLS_RSA_WITH_RC4_128_SHA"}}
			},
			wantErr: `spec.server.tls.cipherSuites[0]: Unsupported value: "TLS_RSA_WITH_RC4_128_SHA"`,
		},
		"cipher suites with TLS 1.3 only": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "tls", MinVersion: coordinatorv1alpha1.TLSVersion13,
					CipherSuites: []coordinatorv1alpha1.TLSCipherSuite{"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}}
			},
			wantErr: `spec.server.tls: Invalid value: cipherSuites apply to TLS 1.2 only: with minVersion VersionTLS13 they would be ignored`,
		},
		"no Secret name": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{}
			},
			wantErr: `spec.server.tls.secretName: Invalid value: "": spec.server.tls.secretName in body should be at least 1 chars long`,
		},
		"a CA bundle for a plain-HTTP gateway": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.CABundle = &coordinatorv1alpha1.CABundleReference{ConfigMapName: "gateway-ca"}
			},
			wantErr: `spec.gateway: Invalid value: caBundle needs an https:// address: it verifies the gateway's TLS certificate`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline(ns, "tls")
			cp.UID, cp.Generation = "", 0
			tc.mutate(cp)
			err := e.client.Create(context.Background(), cp, client.DryRunAll)
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(ContainSubstring(tc.wantErr))
		})
	}
}
