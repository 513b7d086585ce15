package v1alpha1

import (
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// EPPProfileMatchType says how the HTTPRoute recognizes a coordinator leg by its EPP-Profile
// header.
// +kubebuilder:validation:Enum=Exact;RegularExpression
type EPPProfileMatchType string

// EPP-Profile header match types.
const (
	// EPPProfileMatchExact matches the EPP-Profile values the coordinator sends (encode, prefill,
	// decode), one Exact header match each. Exact header matching is Core in the Gateway API, so
	// every conformant gateway supports it.
	EPPProfileMatchExact EPPProfileMatchType = "Exact"
	// EPPProfileMatchRegularExpression matches any non-empty EPP-Profile value (".+"). Regular
	// expression header matching is implementation-specific in the Gateway API.
	EPPProfileMatchRegularExpression EPPProfileMatchType = "RegularExpression"
)

// RouteParentReference names the Gateway (gateway.networking.k8s.io/v1) the HTTPRoute attaches to.
type RouteParentReference struct {
	// name of the Gateway.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// namespace of the Gateway. Defaults to the namespace of this CoordinatorPipeline. A Gateway
	// in another namespace must allow routes from this one (listeners[].allowedRoutes).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// sectionName attaches the route to one listener of the Gateway. When unset the route
	// attaches to every listener that allows it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SectionName string `json:"sectionName,omitempty"`
}

// RouteSpec asks the operator for a Gateway API HTTPRoute (named like the CoordinatorPipeline) that
// puts the coordinator in the gateway's request path. It has two rules: requests carrying an
// EPP-Profile header (the coordinator's own legs) go to the InferencePool of
// spec.inferencePoolRef, where the endpoint picker chooses a worker of that role; every other
// request goes to the coordinator Service. Clients therefore talk to the gateway, the gateway
// sends them to a coordinator, and the coordinator's legs come back through the same gateway to
// the workers. With spec.server.tls the coordinator Service serves HTTPS (port https,
// appProtocol https): the gateway then needs a BackendTLSPolicy (gateway.networking.k8s.io/v1)
// for the Service to connect with TLS and verify the certificate; the operator does not create
// one.
type RouteSpec struct {
	// parentRef is the Gateway the route attaches to. Defaults to spec.gateway.gatewayRef (its
	// name, namespace and sectionName); one of the two must be set.
	// +optional
	ParentRef *RouteParentReference `json:"parentRef,omitempty"`

	// eppProfileMatch says how the route recognizes the coordinator's legs: Exact (the default)
	// matches the EPP-Profile values encode, prefill and decode, which every gateway supports;
	// RegularExpression matches any non-empty value, where the gateway supports it.
	// +optional
	// +kubebuilder:default=Exact
	EPPProfileMatch EPPProfileMatchType `json:"eppProfileMatch,omitempty"`

	// requestTimeout is the gateway's timeout for a whole request on both rules (the
	// HTTPRoute rules' timeouts.request, a Gateway API duration such as 10m; "0s" disables it).
	// Generation requests stream for minutes: some gateways default to 15s. Timeouts are an
	// Extended Gateway API feature; a gateway that does not support them rejects the route,
	// which RouteAccepted reports. Unset leaves the gateway's default.
	// +optional
	// +kubebuilder:validation:Pattern=`^([0-9]{1,5}(h|m|s|ms)){1,4}$`
	RequestTimeout string `json:"requestTimeout,omitempty"`
}

// DisruptionBudgetSpec asks for a PodDisruptionBudget (named like the CoordinatorPipeline) over the
// coordinator pods, limiting voluntary evictions such as node drains. At most one of minAvailable
// and maxUnavailable is set; with neither, maxUnavailable is 1.
// +kubebuilder:validation:XValidation:rule="!(has(self.minAvailable) && has(self.maxUnavailable))",message="set at most one of minAvailable and maxUnavailable"
type DisruptionBudgetSpec struct {
	// minAvailable is the number (e.g. 1) or percentage (e.g. "50%") of coordinator pods that
	// must stay available during a voluntary disruption. A value equal to replicas blocks node
	// drains entirely.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="must be a non-negative integer or a percentage such as 50%"
	MinAvailable *intstr.IntOrString `json:"minAvailable,omitempty"`

	// maxUnavailable is the number (e.g. 1) or percentage (e.g. "25%") of coordinator pods that
	// may be unavailable during a voluntary disruption. Defaults to 1 when minAvailable is unset.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')",message="must be a non-negative integer or a percentage such as 25%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`

	// unhealthyPodEvictionPolicy says when pods that are running but not ready may be evicted:
	// IfHealthyBudget (the Kubernetes default) or AlwaysAllow, which keeps a crash-looping
	// coordinator from blocking a node drain.
	// +optional
	// +kubebuilder:validation:Enum=IfHealthyBudget;AlwaysAllow
	UnhealthyPodEvictionPolicy *policyv1.UnhealthyPodEvictionPolicyType `json:"unhealthyPodEvictionPolicy,omitempty"`
}

// NetworkPolicySpec asks for a NetworkPolicy (named like the CoordinatorPipeline) that selects the
// coordinator pods. Ingress is always restricted: only the API port (8080) and, when the
// coordinators serve metrics, the metrics and admin port are open, to the peers listed here or,
// when a list is empty, to a default that never means "any source". Egress is restricted only
// when egress is set.
type NetworkPolicySpec struct {
	// enabled creates the NetworkPolicy; false removes it and keeps the settings below.
	// +required
	Enabled bool `json:"enabled"`

	// ingressFrom lists the peers (pods, namespaces, IP blocks) allowed to reach the coordinator
	// API port: the gateway's data-plane pods, or clients that call the coordinator Service
	// directly. Empty allows only the gateway's namespace (a namespaceSelector on
	// kubernetes.io/metadata.name): the namespace of route.parentRef and of gateway.gatewayRef
	// (each defaulting to the pipeline's namespace), or, for gateway.address, the namespace of a
	// Service DNS name <service>.<namespace>[.svc[.<cluster domain>]] (a bare <service> is in the
	// pipeline's namespace). When no namespace can be derived (an IP address or an external host
	// name) only the pipeline's own namespace is allowed. This assumes the gateway's proxy pods
	// run in the Gateway's namespace; where they do not (e.g. Envoy Gateway's default deployment
	// in its controller namespace, or a cloud load balancer that connects from node or proxy
	// subnets), list them here. A peer with an empty namespaceSelector allows every namespace.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	IngressFrom []networkingv1.NetworkPolicyPeer `json:"ingressFrom,omitempty"`

	// metricsFrom lists the peers allowed to reach the coordinators' metrics and admin port
	// (server.metrics_port: /metrics and /debug/pipeline), such as the monitoring namespace.
	// Empty allows only pods in the pipeline's own namespace: list the namespace of your
	// Prometheus, e.g. a namespaceSelector on kubernetes.io/metadata.name: monitoring.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	MetricsFrom []networkingv1.NetworkPolicyPeer `json:"metricsFrom,omitempty"`

	// egress restricts the coordinators' outbound traffic. Unset leaves egress open.
	// +optional
	Egress *NetworkPolicyEgress `json:"egress,omitempty"`
}

// NetworkPolicyEgress restricts the coordinators' outbound traffic to DNS (UDP and TCP port 53,
// any destination), the gateway, and the additional rules.
type NetworkPolicyEgress struct {
	// gatewayTo lists the peers where the gateway's data-plane pods run, e.g. a namespaceSelector
	// for the gateway's namespace. Empty allows the gateway ports to every destination.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	GatewayTo []networkingv1.NetworkPolicyPeer `json:"gatewayTo,omitempty"`

	// gatewayPorts are the TCP ports the gateway traffic may use. Network policies see the
	// destination pod's port after Service translation, so when the gateway address is a
	// Service whose port differs from its pods' port, list the pods' port here. Defaults to the
	// port of the gateway address (80 for http:// and 443 for https:// without one).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=65535
	GatewayPorts []int32 `json:"gatewayPorts,omitempty"`

	// additional are further egress rules, for what else the pipeline reaches: the render
	// service, media hosts of replace-media-urls, the tracing collector, the async broker's
	// Redis.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Additional []networkingv1.NetworkPolicyEgressRule `json:"additional,omitempty"`
}
