package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// KVConnector names a KV-cache transfer protocol between prefill and decode workers. The enum
// marker lists KVConnectors; a test keeps both equal to the data plane's KV connectors.
// +kubebuilder:validation:Enum=kv-nixl;kv-sglang;kv-shared-storage
type KVConnector string

// KV connectors understood by the data plane.
const (
	// KVConnectorNIXL transfers the KV cache with NIXL (vLLM NixlConnector).
	KVConnectorNIXL KVConnector = "kv-nixl"
	// KVConnectorSGLang uses SGLang's bootstrap-server protocol.
	KVConnectorSGLang KVConnector = "kv-sglang"
	// KVConnectorSharedStorage exchanges the KV cache through shared storage.
	KVConnectorSharedStorage KVConnector = "kv-shared-storage"
)

// KVConnectors lists every KV connector accepted by the API.
var KVConnectors = []KVConnector{KVConnectorNIXL, KVConnectorSGLang, KVConnectorSharedStorage}

// ECConnector names an encoder-cache transfer protocol between encode and prefill/decode workers.
// The enum marker lists ECConnectors; a test keeps both equal to the data plane's EC connectors.
// +kubebuilder:validation:Enum=ec-nixl;ec-shared-storage
type ECConnector string

// EC connectors understood by the data plane.
const (
	// ECConnectorNIXL transfers encoder outputs with NIXL.
	ECConnectorNIXL ECConnector = "ec-nixl"
	// ECConnectorSharedStorage exchanges encoder outputs through shared storage.
	ECConnectorSharedStorage ECConnector = "ec-shared-storage"
)

// ECConnectors lists every EC connector accepted by the API.
var ECConnectors = []ECConnector{ECConnectorNIXL, ECConnectorSharedStorage}

// PoolFailurePolicy is what the coordinator does with a request whose encode or prefill pool
// cannot serve it after its retries (pipeline.on_pool_failure). The enum marker lists
// PoolFailurePolicies; a test keeps both equal to the data plane's policies.
// +kubebuilder:validation:Enum=aggregate;fail
type PoolFailurePolicy string

// Pool failure policies of the data plane.
const (
	// PoolFailureAggregate serves the request on a decode worker alone, which encodes and
	// prefills itself (aggregated serving).
	PoolFailureAggregate PoolFailurePolicy = "aggregate"
	// PoolFailureFail answers the request 503.
	PoolFailureFail PoolFailurePolicy = "fail"
)

// PoolFailurePolicies lists every pool failure policy accepted by the API.
var PoolFailurePolicies = []PoolFailurePolicy{PoolFailureAggregate, PoolFailureFail}

// StepType is the registered name of a pipeline step. The enum marker lists StepTypes; a test
// keeps both equal to the step types the data plane registers.
// +kubebuilder:validation:Enum=async-broker;replace-media-urls;render;conditional-decode;encode;prefill;decode;prefill-decode
type StepType string

// Step types of the data plane.
const (
	// StepAsyncBroker bridges to an asynchronous request broker (llm-d-async over Redis): it
	// queues or holds requests by mode header and must be the first step.
	StepAsyncBroker StepType = "async-broker"
	// StepReplaceMediaURLs downloads remote media and inlines it into the request.
	StepReplaceMediaURLs StepType = "replace-media-urls"
	// StepRender tokenizes the request (needed for tokens-in legs, useOpenAIFormat=false).
	StepRender StepType = "render"
	// StepConditionalDecode tries decode alone first and continues only when the decode worker
	// cannot serve the request without the earlier phases.
	StepConditionalDecode StepType = "conditional-decode"
	// StepEncode runs the multimodal encoders (EPP-Profile: encode).
	StepEncode StepType = "encode"
	// StepPrefill runs prefill on a prefill worker (EPP-Profile: prefill).
	StepPrefill StepType = "prefill"
	// StepDecode is the terminal step: it streams the decode worker's answer to the client.
	StepDecode StepType = "decode"
	// StepPrefillDecode is the terminal step of kv-sglang pipelines, in place of prefill and
	// decode: it reserves a prefill endpoint through the picker and sends prefill and decode
	// together, as SGLang's transfer needs.
	StepPrefillDecode StepType = "prefill-decode"
)

// StepTypes lists every step type accepted by the API, in the order a pipeline runs them.
var StepTypes = []StepType{StepAsyncBroker, StepReplaceMediaURLs, StepRender, StepConditionalDecode, StepEncode, StepPrefill, StepDecode, StepPrefillDecode}

// InferencePoolReference names an InferencePool (inference.networking.k8s.io/v1) in the
// namespace of the CoordinatorPipeline.
type InferencePoolReference struct {
	// name of the InferencePool, in the same namespace as this CoordinatorPipeline. The pool does
	// not have to exist yet: the InferencePoolResolved condition reports it until it does.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// GatewayReference points at a Gateway API Gateway (gateway.networking.k8s.io/v1) whose
// status address the coordinator sends its worker legs to.
type GatewayReference struct {
	// name of the Gateway.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// namespace of the Gateway. Defaults to the namespace of this CoordinatorPipeline.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`

	// sectionName selects the listener by name. When unset, the first listener with protocol
	// HTTP or HTTPS is used. The listener decides the URL scheme (HTTPS gives https://) and,
	// unless port is set, the port.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SectionName string `json:"sectionName,omitempty"`

	// port overrides the listener's port in the rendered gateway address.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port *int32 `json:"port,omitempty"`
}

// GatewaySpec says where the coordinator reaches the Inference Gateway and how its HTTP client
// behaves. Exactly one of address and gatewayRef is set.
// +kubebuilder:validation:XValidation:rule="has(self.address) != has(self.gatewayRef)",message="exactly one of address or gatewayRef must be set"
// +kubebuilder:validation:XValidation:rule="!has(self.caBundle) || !has(self.address) || !isURL(self.address) || url(self.address).getScheme() == 'https'",message="caBundle needs an https:// address: it verifies the gateway's TLS certificate"
type GatewaySpec struct {
	// The CEL rules of address read the host from the raw URL (the authority after '//', without a
	// [bracketed] IPv6 address's brackets or the port), since url().getHostname() has no size
	// bound for the cost estimator; a host that is neither a DNS name nor a canonical IP (user
	// information, percent-encoding, a zone) is refused first, so the other rules see what Go's
	// URL parser sees.

	// address is the gateway's base URL, e.g. http://inference-gateway.infra.svc:80. It is
	// rendered as gateway.address. Mutually exclusive with gatewayRef. The host must not be an
	// unspecified or link-local address or a cloud metadata service (169.254.0.0/16, fe80::/10,
	// 100.100.100.200, fd00:ec2::254, metadata.google.internal); loopback is allowed (a gateway
	// sidecar in the coordinator's pod, a local demo). An
	// IP address must be written in its canonical form (no zone, no IPv4-mapped IPv6, no octal or
	// hexadecimal IPv4): the coordinator forwards client requests there.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && self.matches('^https?://') && url(self).getHostname() != ''",message="address must be an http:// or https:// URL with a host, e.g. http://inference-gateway:80"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^https?://[^/?#]') || isIP((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2)))) || ((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2))).matches('^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?([.][a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)*[.]?$') && !(self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2))).matches('^(0[xX][0-9a-fA-F]*|[0-9]+)([.](0[xX][0-9a-fA-F]*|[0-9]+))*[.]?$'))",message="address host must be a DNS name or an IP address in canonical form (dotted-decimal IPv4, IPv6 without a zone or an IPv4-mapped form), without user information or percent-encoding"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^https?://[^/?#]') || !isIP((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2)))) || !(ip((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2)))).isUnspecified() || cidr('0.0.0.0/8').containsIP((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2)))))",message="address host must not be an unspecified address (0.0.0.0/8, ::)"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^https?://[^/?#]') || !isIP((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2)))) || !(cidr('169.254.0.0/16').containsIP((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2)))) || cidr('fe80::/10').containsIP((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2)))))",message="address host must not be link-local (169.254.0.0/16, fe80::/10): cloud instance metadata services listen there"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^https?://[^/?#]') || !isIP((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2)))) || !(cidr('100.100.100.200/32').containsIP((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2)))) || cidr('fd00:ec2::254/128').containsIP((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2)))))",message="address host must not be a cloud instance metadata service (100.100.100.200, fd00:ec2::254)"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^https?://[^/?#]') || !((self.find('//[^/?#]*').startsWith('//[') && self.find('//[^/?#]*').contains(']') ? self.find('//[^/?#]*').substring(3, self.find('//[^/?#]*').indexOf(']')) : (self.find('//[^/?#]*').contains(':') ? self.find('//[^/?#]*').substring(2, self.find('//[^/?#]*').indexOf(':')) : self.find('//[^/?#]*').substring(2))).lowerAscii() in ['metadata', 'metadata.', 'metadata.google.internal', 'metadata.google.internal.'])",message="address host must not be a cloud instance metadata service name (metadata, metadata.google.internal)"
	Address string `json:"address,omitempty"`

	// gatewayRef names a Gateway whose first status address (and a listener's port and
	// protocol) make up the gateway address. The operator watches the Gateway and re-renders
	// the configuration when its address changes. Mutually exclusive with address.
	// +optional
	GatewayRef *GatewayReference `json:"gatewayRef,omitempty"`

	// timeout bounds the wait for a worker's response headers (gateway.timeout); response
	// bodies stream unbounded. Defaults to the data plane's default (60s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// idleConnTimeout closes pooled gateway connections idle for this long
	// (gateway.idle_conn_timeout). Defaults to the data plane's default (90s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	IdleConnTimeout *metav1.Duration `json:"idleConnTimeout,omitempty"`

	// maxIdleConnsPerHost is the keep-alive pool size towards the gateway
	// (gateway.max_idle_conns_per_host). Defaults to the data plane's default (100).
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxIdleConnsPerHost *int32 `json:"maxIdleConnsPerHost,omitempty"`

	// idleTimeout bounds the silence between two reads of a worker's answer once its headers
	// arrived, streams included (gateway.idle_timeout). "0s" disables it. Defaults to the data
	// plane's default (60s). Reloaded in place.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	IdleTimeout *metav1.Duration `json:"idleTimeout,omitempty"`

	// requestTimeout bounds a whole leg the coordinator reads itself or relays unstreamed
	// (encode, prefill, a non-streaming decode), headers to last byte (gateway.request_timeout).
	// "0s" disables it. Defaults to the data plane's default (10m). Reloaded in place.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	RequestTimeout *metav1.Duration `json:"requestTimeout,omitempty"`

	// maxResponseSizeMiB is the largest answer the coordinator reads itself (the encode and
	// prefill legs), in MiB (gateway.max_response_size). Defaults to the data plane's default
	// (16). Reloaded in place.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	MaxResponseSizeMiB *int32 `json:"maxResponseSizeMiB,omitempty"`

	// profileHeaders are the request headers that carry each leg's EPP profile
	// (gateway.profile_headers); every leg carries all of them, and the HTTPRoute's worker rule
	// matches the first. x-llm-d-epp-profile is the spelling of llm-d 0.3 and later, EPP-Profile
	// the earlier one. Defaults to the data plane's default (both).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9][-A-Za-z0-9]*$`
	ProfileHeaders []string `json:"profileHeaders,omitempty"`

	// retry says when a leg that failed without being served (connection refused or reset
	// before the answer's headers, no headers within timeout, or 502, 503, 504 or 429 from the
	// gateway) is tried again, each attempt a new pick by the endpoint picker
	// (gateway.retry). Unset fields take the data plane's defaults. Reloaded in place.
	// +optional
	Retry *GatewayRetrySpec `json:"retry,omitempty"`

	// caBundle names a ConfigMap with the PEM CA certificates that verify an https:// gateway
	// (gateway.ca_file), instead of the system roots of the coordinator image: e.g. the
	// cluster's kube-root-ca.crt, a trust-manager Bundle, or an OpenShift service-CA ConfigMap.
	// The ConfigMap is mounted read-only (the coordinators read the file when they build their
	// gateway client); a missing one keeps new coordinator pods from starting and makes
	// Ready=False with reason CABundleNotFound.
	// +optional
	CABundle *CABundleReference `json:"caBundle,omitempty"`
}

// GatewayRetrySpec configures the retries of the coordinator's worker legs (gateway.retry).
// +kubebuilder:validation:XValidation:rule="!has(self.initialBackoff) || !has(self.maxBackoff) || duration(self.maxBackoff) >= duration(self.initialBackoff)",message="maxBackoff must not be below initialBackoff"
type GatewayRetrySpec struct {
	// maxAttempts is the most attempts one leg makes, the first included
	// (gateway.retry.max_attempts); 1 disables retries. Defaults to the data plane's default (3).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	MaxAttempts *int32 `json:"maxAttempts,omitempty"`

	// maxRetriesPerRequest caps the retries (and stream resumes) of all the legs of one request
	// together (gateway.retry.max_retries_per_request); 0 disables retries. Defaults to the data
	// plane's default (4).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	MaxRetriesPerRequest *int32 `json:"maxRetriesPerRequest,omitempty"`

	// initialBackoff is the first retry's backoff bound: the capped exponential backoff (full
	// jitter) starts there (gateway.retry.initial_backoff). Defaults to the data plane's
	// default (25ms).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	InitialBackoff *metav1.Duration `json:"initialBackoff,omitempty"`

	// maxBackoff caps the backoff before a retry (gateway.retry.max_backoff); it must not be
	// below initialBackoff. Defaults to the data plane's default (1s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	MaxBackoff *metav1.Duration `json:"maxBackoff,omitempty"`

	// maxRetryAfter is the longest Retry-After of a 429 or 503 the coordinator waits for before
	// retrying; a longer one is passed on as the client's answer (gateway.retry.max_retry_after).
	// Defaults to the data plane's default (2s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	MaxRetryAfter *metav1.Duration `json:"maxRetryAfter,omitempty"`

	// budgetPercent caps each coordinator's retries at this percentage of its first attempts,
	// so that a dead pool cannot cause a retry storm; rendered as gateway.retry.budget_ratio
	// (percent/100). Defaults to the data plane's default (20, a ratio of 0.2).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	BudgetPercent *int32 `json:"budgetPercent,omitempty"`

	// budgetMinPerSecond is the retry rate each coordinator is allowed whatever budgetPercent,
	// so that a quiet coordinator can still retry (gateway.retry.budget_min_per_second).
	// Defaults to the data plane's default (5).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	BudgetMinPerSecond *int32 `json:"budgetMinPerSecond,omitempty"`
}

// CABundleReference names a key of a ConfigMap, in the pipeline's namespace, holding
// PEM-encoded CA certificates.
type CABundleReference struct {
	// configMapName is the ConfigMap's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	ConfigMapName string `json:"configMapName"`

	// key is the ConfigMap key holding the certificates.
	// +optional
	// +kubebuilder:default=ca.crt
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key,omitempty"`
}

// PipelineStep is one entry of the ordered pipeline.
type PipelineStep struct {
	// type is the step's registered name.
	// +required
	Type StepType `json:"type"`

	// params are the step's own parameters, passed through verbatim as
	// pipeline.steps[].params. Each step validates its params when the operator builds the
	// pipeline; an unknown or invalid param sets PipelineValid=False with the key that failed,
	// e.g. pipeline.steps[2].params.max_parallel. Steps inherit kv_connector, ec_connector,
	// use_openai_format and on_pool_failure from the pipeline unless they set them here.
	// +optional
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	Params *apiextensionsv1.JSON `json:"params,omitempty"`
}

// PipelineSpec is the request pipeline the coordinator runs. It is rendered as the pipeline
// section of the data-plane configuration; changing it updates the ConfigMap and the
// coordinators reload it in place, without restarting pods.
// +kubebuilder:validation:XValidation:rule="!has(self.useOpenAIFormat) || self.useOpenAIFormat || (has(self.steps) && self.steps.exists(s, s.type == 'render'))",message="useOpenAIFormat=false (tokens-in legs) requires a render step"
// +kubebuilder:validation:XValidation:rule="!has(self.kvConnector) || self.kvConnector != 'kv-sglang' || !has(self.steps) || !self.steps.exists(s, s.type == 'prefill')",message="kvConnector kv-sglang needs the prefill-decode step in place of prefill and decode: SGLang's transfer needs both in flight together"
type PipelineSpec struct {
	// kvConnector is the default KV-cache transfer protocol of the prefill and decode steps.
	// +optional
	// +kubebuilder:default=kv-shared-storage
	KVConnector KVConnector `json:"kvConnector,omitempty"`

	// ecConnector is the default encoder-cache transfer protocol of the encode, prefill and
	// decode steps.
	// +optional
	// +kubebuilder:default=ec-shared-storage
	ECConnector ECConnector `json:"ecConnector,omitempty"`

	// useOpenAIFormat selects the OpenAI wire format for the encode and prefill legs (true) or
	// tokens-in /inference/v1/generate (false), which needs a render step.
	// +optional
	// +kubebuilder:default=true
	UseOpenAIFormat *bool `json:"useOpenAIFormat,omitempty"`

	// onPoolFailure is what happens to a request whose encode or prefill pool cannot serve it
	// after its retries (pipeline.on_pool_failure): aggregate serves it on a decode worker
	// alone, fail answers 503. Steps inherit it unless they set on_pool_failure in their params.
	// Defaults to the data plane's default (aggregate).
	// +optional
	OnPoolFailure PoolFailurePolicy `json:"onPoolFailure,omitempty"`

	// forwardResponseHeaders are the headers a phase's answer carries that are sent on every
	// later leg of the same request (pipeline.forward_response_headers): the disaggregated
	// revision keeps one request's prefill and decode on one revision during a rollout. Clients'
	// values of them are dropped. Absent: the data plane's default (x-llm-d-disagg-revision); an
	// empty list disables it (the field has no omitempty, so that [] survives a round trip).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9][-A-Za-z0-9]*$`
	ForwardResponseHeaders []string `json:"forwardResponseHeaders"`

	// steps run in this order. The last step is decode (or prefill-decode, which replaces prefill
	// and decode), and it appears only there; async-broker, when present, is the first; every
	// step type appears at most once.
	// +required
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="size(self) > 0",message="at least one step is required; a pipeline ends with decode"
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self[size(self) - 1].type == 'decode' || self[size(self) - 1].type == 'prefill-decode'",message="the last step must be decode or prefill-decode"
	// +kubebuilder:validation:XValidation:rule="!self.exists(s, s.type == 'prefill-decode') || !self.exists(s, s.type == 'prefill' || s.type == 'decode')",message="prefill-decode replaces prefill and decode: a pipeline has one or the other"
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || !self.exists(s, s.type == 'async-broker') || self[0].type == 'async-broker'",message="async-broker must be the first step"
	// +kubebuilder:validation:XValidation:rule="self.all(s, self.exists_one(o, o.type == s.type))",messageExpression="'step type ' + self.map(s, s.type).filter(t, !self.exists_one(o, o.type == t))[0] + ' appears more than once; each step type may appear at most once'"
	// +listType=atomic
	Steps []PipelineStep `json:"steps"`
}

// TokenizersMountPath is the directory under which the coordinator pods mount spec.tokenizers,
// each read-only at TokenizersMountPath/<name>. A render step's tokenizer param is one of these
// directories, or a directory below one.
const TokenizersMountPath = "/var/run/coordinator/tokenizers"

// AutoscalingSpec bounds the coordinators' HorizontalPodAutoscaler and sets its targets: the
// average CPU utilization of the coordinator pods and the average requests in flight per pod
// (the coordinator's coordinator_requests_in_flight gauge, served to the autoscaler by a
// custom-metrics adapter such as the Prometheus adapter). At least one target is required.
// +kubebuilder:validation:XValidation:rule="!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",message="minReplicas must not be above maxReplicas"
// +kubebuilder:validation:XValidation:rule="has(self.targetCPUUtilizationPercent) || has(self.targetInFlightRequests)",message="set targetCPUUtilizationPercent, targetInFlightRequests or both: the autoscaler needs a target"
type AutoscalingSpec struct {
	// minReplicas is the fewest coordinator pods the autoscaler keeps. Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	MinReplicas *int32 `json:"minReplicas,omitempty"`

	// maxReplicas is the most coordinator pods the autoscaler runs.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxReplicas int32 `json:"maxReplicas"`

	// targetCPUUtilizationPercent is the average CPU use of the coordinator pods the autoscaler
	// aims at, in percent of their CPU request (spec.resources.requests.cpu must be set for it to
	// act).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	TargetCPUUtilizationPercent *int32 `json:"targetCPUUtilizationPercent,omitempty"`

	// targetInFlightRequests is the average number of requests in flight per coordinator pod the
	// autoscaler aims at, read as the Pods metric inFlightMetricName.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	TargetInFlightRequests *int32 `json:"targetInFlightRequests,omitempty"`

	// inFlightMetricName is the name the custom-metrics adapter serves the coordinators' requests
	// in flight under (a Pods metric). Default coordinator_requests_in_flight, the gauge's own
	// name, as the Prometheus adapter rule in docs/operations.md serves it.
	// +optional
	// +kubebuilder:default=coordinator_requests_in_flight
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-zA-Z_:][a-zA-Z0-9_:.]*$`
	InFlightMetricName string `json:"inFlightMetricName,omitempty"`
}

// Tokenizer is a directory of a model's Hugging Face tokenizer files, mounted read-only into the
// coordinator pods at /var/run/coordinator/tokenizers/<name>. Exactly one source is set.
// +kubebuilder:validation:XValidation:rule="has(self.configMap) != has(self.persistentVolumeClaim)",message="exactly one of configMap or persistentVolumeClaim must be set: the source of the tokenizer's files"
type Tokenizer struct {
	// name of the tokenizer, unique in the list: the directory
	// /var/run/coordinator/tokenizers/<name> of the coordinator pods, which a render step's
	// tokenizer param names. A DNS label of at most 53 characters (the pod volume is
	// tokenizer-<name>).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=53
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// configMap holds the files, one key each (keys become file names: no subdirectories), for
	// small tokenizers: a ConfigMap holds at most 1 MiB. The operator reads it to validate the
	// pipeline with its files, and watches it: an edit renders a new tokenizer_revision into the
	// render steps that use it, and the coordinators reload in place once the kubelet has
	// refreshed the mounted files.
	// +optional
	ConfigMap *TokenizerConfigMapSource `json:"configMap,omitempty"`

	// persistentVolumeClaim holds the files on a volume (a model's real tokenizer is larger than
	// a ConfigMap), mounted read-only. The operator does not read it: it validates the render
	// step's params, and the coordinator pods check the files when they load them. Every
	// coordinator pod mounts the claim, so it needs the ReadOnlyMany or ReadWriteMany access mode
	// unless the pods share a node. After changing the files, change the render step's
	// tokenizer_revision param to make the coordinators reload them.
	// +optional
	PersistentVolumeClaim *TokenizerPersistentVolumeClaimSource `json:"persistentVolumeClaim,omitempty"`
}

// TokenizerConfigMapSource names a ConfigMap, in the pipeline's namespace, whose keys are the
// tokenizer's files.
type TokenizerConfigMapSource struct {
	// name of the ConfigMap. Until it exists PipelineValid is False (reason TokenizerNotFound) and
	// the operator changes neither the configuration nor the Deployment.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`
}

// TokenizerPersistentVolumeClaimSource names a PersistentVolumeClaim, in the pipeline's
// namespace, and the directory of the volume holding the tokenizer's files.
type TokenizerPersistentVolumeClaimSource struct {
	// claimName is the PersistentVolumeClaim's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	ClaimName string `json:"claimName"`

	// subPath is the directory of the volume mounted at /var/run/coordinator/tokenizers/<name>,
	// relative to the volume's root, e.g. models/qwen3-8b. Unset, the volume's root.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.matches('(^|/)[.][.](/|$)')",message="subPath must be a relative path without '..' elements"
	SubPath string `json:"subPath,omitempty"`
}

// CanarySpec is a second pipeline and its share of the traffic (the data plane's canary block).
type CanarySpec struct {
	// weightPercent is the share of requests the canary serves: 0 stages it (built and
	// validated, no traffic), 100 sends it every request. Of every 100 consecutive requests a
	// coordinator pod serves, exactly weightPercent run on the canary.
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	WeightPercent int32 `json:"weightPercent"`

	// pipeline is the canary's pipeline, with the rules and defaults of spec.pipeline. It shares
	// the gateway, server and tracing settings.
	// +required
	Pipeline PipelineSpec `json:"pipeline"`
}

// PipelineRevisionStatus is one pipeline the coordinators serve, with its traffic.
type PipelineRevisionStatus struct {
	// track is stable (spec.pipeline) or canary (spec.canary.pipeline).
	// +required
	// +kubebuilder:validation:Enum=stable;canary
	Track string `json:"track"`

	// revision is the pipeline's revision: a fingerprint of its pipeline block alone, so a
	// promoted canary keeps it. Every leg of a request carries it in
	// x-coordinator-pipeline-revision; it is the revision label of
	// coordinator_pipeline_requests_total.
	// +required
	Revision string `json:"revision"`

	// weightPercent is the share of requests the pipeline serves.
	// +required
	WeightPercent int32 `json:"weightPercent"`

	// pods is the number of ready coordinator pods that report serving this revision on this
	// track.
	// +optional
	Pods int32 `json:"pods"`

	// requests is what those pods report they ran on the revision since each loaded it. A pod
	// that restarts starts again from zero: the metric is the record, this is the quick look.
	// +optional
	Requests int64 `json:"requests"`

	// errors is how many of those requests failed: answered 5xx, or cut off after the response
	// started.
	// +optional
	Errors int64 `json:"errors"`
}

// ServerSpec configures the coordinator's inbound HTTP server. A running coordinator cannot
// change its listener's timeouts: changing readTimeout or writeTimeout rolls the Deployment, and
// so do shutdownTimeout and drainDelay (the pods' terminationGracePeriodSeconds follows them), and so does
// setting or removing tls. maxRequestBodySizeMiB is reloaded in place.
type ServerSpec struct {
	// readTimeout bounds reading a whole request, body included (server.read_timeout).
	// "0s" disables it. Defaults to the data plane's default (30s). Changing it rolls the
	// Deployment.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	ReadTimeout *metav1.Duration `json:"readTimeout,omitempty"`

	// writeTimeout bounds writing a non-streaming response (server.write_timeout); streaming
	// responses are exempt. "0s" disables it. Defaults to the data plane's default (2m).
	// Changing it rolls the Deployment.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	WriteTimeout *metav1.Duration `json:"writeTimeout,omitempty"`

	// shutdownTimeout bounds the drain of in-flight requests and streams on SIGTERM, after
	// drainDelay (server.shutdown_timeout): the longest an in-flight request may still run once
	// the coordinator stops accepting; what runs longer is cut. The pods'
	// terminationGracePeriodSeconds is drainDelay + shutdownTimeout + 5s, so changing it rolls
	// the Deployment. Defaults to the data plane's default (25s).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	ShutdownTimeout *metav1.Duration `json:"shutdownTimeout,omitempty"`

	// drainDelay is how long a terminating coordinator keeps accepting and serving new
	// connections after SIGTERM (server.drain_delay), its readiness failing and every answer
	// closing its connection, while the Service's endpoints, kube-proxy and load balancers stop
	// sending it new ones; then it stops accepting and drains (shutdownTimeout). "0s" disables
	// it. At most 5m. Defaults to the data plane's default (5s). The pods'
	// terminationGracePeriodSeconds is drainDelay + shutdownTimeout + 5s, so changing it rolls
	// the Deployment. Setting it needs a coordinator image of configuration schema 5.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('5m')",message="drainDelay must be at most 5m: every terminating coordinator pod waits that long before it drains"
	DrainDelay *metav1.Duration `json:"drainDelay,omitempty"`

	// maxRequestBodySizeMiB is the largest accepted request body in MiB
	// (server.max_request_body_size); larger requests get 413. Defaults to the data plane's
	// default (64). Reloaded in place.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65536
	MaxRequestBodySizeMiB *int32 `json:"maxRequestBodySizeMiB,omitempty"`

	// tls makes the coordinator serve HTTPS, on its API port and on its metrics and admin
	// listener, with the certificate of a Secret. Unset serves plain HTTP.
	// +optional
	TLS *ServerTLSSpec `json:"tls,omitempty"`

	// metricsTenantHeader names a request header whose value labels the coordinators'
	// coordinator_tenant_* series (server.metrics_tenant_header), bounded to 1000 served values.
	// Clients control it: name a header the edge sets after authentication. Reloaded in place;
	// needs a coordinator of configuration schema 2.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][-A-Za-z0-9]*$`
	MetricsTenantHeader string `json:"metricsTenantHeader,omitempty"`
}

// TLSVersion names a TLS protocol version the way Go's crypto/tls does.
// +kubebuilder:validation:Enum=VersionTLS12;VersionTLS13
type TLSVersion string

// TLS versions the API accepts. TLS 1.0 and 1.1 are deprecated (RFC 8996) and not offered.
const (
	TLSVersion12 TLSVersion = "VersionTLS12"
	TLSVersion13 TLSVersion = "VersionTLS13"
)

// TLSVersions lists every TLS version accepted by the API.
var TLSVersions = []TLSVersion{TLSVersion12, TLSVersion13}

// TLSCipherSuite is the Go name of a TLS 1.2 cipher suite (crypto/tls.CipherSuites(): the
// suites Go considers secure; TLS 1.3 suites are not configurable). The enum marker lists
// TLSCipherSuites; a test keeps it equal to what Go and the data plane accept.
// +kubebuilder:validation:Enum=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256;TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384;TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256;TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256;TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384;TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256;TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA;TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA;TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA;TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA
type TLSCipherSuite string

// TLSCipherSuites lists every cipher suite accepted by the API.
var TLSCipherSuites = []TLSCipherSuite{
	"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
	"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
	"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
	"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
	"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
	"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
	"TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
	"TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
	"TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
	"TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
}

// ServerTLSSpec is the coordinator's serving certificate and TLS parameters. The Secret is
// mounted read-only into the coordinator pods; the coordinators reload a renewed certificate
// from the mounted files without a restart (kubelet refreshes the mount), so rotating the Secret,
// e.g. by cert-manager, does not roll the Deployment.
// +kubebuilder:validation:XValidation:rule="!has(self.cipherSuites) || !has(self.minVersion) || self.minVersion != 'VersionTLS13'",message="cipherSuites apply to TLS 1.2 only: with minVersion VersionTLS13 they would be ignored"
type ServerTLSSpec struct {
	// secretName names a Secret in the pipeline's namespace with the certificate chain and
	// private key under tls.crt and tls.key: a kubernetes.io/tls Secret, such as the one a
	// cert-manager Certificate writes. Its certificate should name the coordinator Service
	// (<name>.<namespace>.svc) for clients that verify it, like a gateway's BackendTLSPolicy.
	// Until it exists new coordinator pods cannot start and Ready is False with reason
	// TLSSecretNotFound.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName"`

	// minVersion is the lowest TLS version offered (server.tls_min_version). Defaults to the
	// data plane's default, VersionTLS12.
	// +optional
	MinVersion TLSVersion `json:"minVersion,omitempty"`

	// cipherSuites restricts the TLS 1.2 cipher suites (server.tls_cipher_suites), by Go name.
	// Unset uses Go's default secure suites. TLS 1.3 suites are not configurable.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	CipherSuites []TLSCipherSuite `json:"cipherSuites,omitempty"`
}

// TracingSpec configures the coordinator's OpenTelemetry tracing: spans of each request and
// each of its legs, exported over OTLP/HTTP (the data plane's tracing section).
type TracingSpec struct {
	// enabled turns span export on (tracing.enabled). false keeps the other settings and turns
	// export off.
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`

	// endpoint is the OTLP/HTTP collector's base URL, e.g. http://otel-collector.monitoring:4318
	// (tracing.endpoint). Unset: the OTEL_EXPORTER_OTLP_* environment (set it in env), else
	// localhost:4318. With networkPolicy.egress, allow the collector in egress.additional.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && self.matches('^https?://') && url(self).getHostname() != ''",message="endpoint must be an http:// or https:// URL with a host, e.g. http://otel-collector:4318"
	Endpoint string `json:"endpoint,omitempty"`

	// serviceName is the service.name resource attribute of the spans (tracing.service_name).
	// Defaults to the data plane's default (coordinator).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	ServiceName string `json:"serviceName,omitempty"`

	// samplingRatePerMillion is how many of a million new traces are sampled, as in the
	// Kubernetes components' tracing configuration; a sampled client trace (traceparent) is
	// always followed. Rendered as tracing.sample_ratio (rate / 1000000). Defaults to the data
	// plane's default (100000, a ratio of 0.1).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	SamplingRatePerMillion *int32 `json:"samplingRatePerMillion,omitempty"`

	// resourceAttributes are added to the spans' resource, e.g. deployment.environment.name or
	// k8s.cluster.name. They are rendered as the coordinator container's OTEL_RESOURCE_ATTRIBUTES
	// (sorted by name, values percent-encoded); service.name is set with serviceName instead.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(a, a.name != 'service.name')",message="resourceAttributes must not set service.name: set tracing.serviceName"
	ResourceAttributes []TracingResourceAttribute `json:"resourceAttributes,omitempty"`
}

// TracingResourceAttribute is one OpenTelemetry resource attribute.
type TracingResourceAttribute struct {
	// name of the attribute, e.g. deployment.environment.name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][-._/A-Za-z0-9]*$`
	Name string `json:"name"`

	// value of the attribute (any text; the operator percent-encodes it).
	// +required
	// +kubebuilder:validation:MaxLength=1024
	Value string `json:"value"`
}

// CoordinatorPipelineSpec is the desired state of a CoordinatorPipeline: which InferencePool and
// Gateway it fronts, the request pipeline, how the coordinator pods run, and how they are exposed
// and protected.
// +kubebuilder:validation:XValidation:rule="!has(self.route) || has(self.route.parentRef) || has(self.gateway.gatewayRef)",message="route needs a Gateway to attach to: set route.parentRef or gateway.gatewayRef"
// +kubebuilder:validation:XValidation:rule="!has(self.env) || !has(self.tracing) || !has(self.tracing.resourceAttributes) || !self.env.exists(e, e.name == 'OTEL_RESOURCE_ATTRIBUTES')",message="env must not set OTEL_RESOURCE_ATTRIBUTES when tracing.resourceAttributes is set: the operator renders it from them",fieldPath=".env"
// +kubebuilder:validation:XValidation:rule="!has(self.env) || !has(self.tracing) || !has(self.tracing.serviceName) || !self.env.exists(e, e.name == 'OTEL_SERVICE_NAME')",message="env must not set OTEL_SERVICE_NAME when tracing.serviceName is set: it would override it",fieldPath=".env"
// +kubebuilder:validation:XValidation:rule="!has(self.tokenizers) || !has(self.volumes) || !self.volumes.exists(v, self.tokenizers.exists(t, v.name == 'tokenizer-' + t.name))",message="volume names tokenizer-<name> of the names in spec.tokenizers are the operator's: choose another name",fieldPath=".volumes"
// +kubebuilder:validation:XValidation:rule="!has(self.tokenizers) || !has(self.volumeMounts) || !self.volumeMounts.exists(m, m.mountPath == '/var/run/coordinator/tokenizers' || m.mountPath.startsWith('/var/run/coordinator/tokenizers/'))",message="volumeMounts must not mount at or under /var/run/coordinator/tokenizers when spec.tokenizers is set: the operator mounts the tokenizers there",fieldPath=".volumeMounts"
// +kubebuilder:validation:XValidation:rule="!has(self.rateLimit) || has(self.rateLimit.tenantHeader) || (has(self.server) && has(self.server.metricsTenantHeader))",message="rateLimit needs the tenant header: set rateLimit.tenantHeader or server.metricsTenantHeader",fieldPath=".rateLimit"
type CoordinatorPipelineSpec struct {
	// inferencePoolRef names the InferencePool whose workers the pipeline's legs are routed to
	// (through the gateway, by EPP-Profile).
	// +required
	InferencePoolRef InferencePoolReference `json:"inferencePoolRef"`

	// gateway says where the coordinator reaches the Inference Gateway.
	// +required
	Gateway GatewaySpec `json:"gateway"`

	// pipeline is the ordered list of steps each request runs through, with connector and
	// format defaults. Changes are hot-reloaded by the coordinators.
	// +required
	Pipeline PipelineSpec `json:"pipeline"`

	// canary is a revision canary: a second pipeline that serves weightPercent of the requests,
	// each request wholly on one of the two. Promote it by moving its pipeline to spec.pipeline
	// and removing spec.canary (its revision stays the same); roll back by removing it.
	// status.revisions shows each pipeline's requests and errors.
	// +optional
	Canary *CanarySpec `json:"canary,omitempty"`

	// tokenizers are directories of Hugging Face tokenizer files (tokenizer.json,
	// tokenizer_config.json, optionally chat_template.jinja...) mounted read-only into the
	// coordinator pods, each at /var/run/coordinator/tokenizers/<name>, so that a render step
	// tokenizes in process: its tokenizer param names that directory (or one below it), in
	// spec.pipeline or spec.canary.pipeline. A render step's tokenizer outside these directories
	// makes PipelineValid False. The operator builds the pipeline with the files of a ConfigMap
	// source (a broken tokenizer.json or an unsupported chat template makes PipelineValid False with
	// the data plane's error) and renders a fingerprint of its content as the step's
	// tokenizer_revision, so that editing the ConfigMap reloads the coordinators in place; the
	// files of a persistentVolumeClaim are checked by the pods when they load them. Adding,
	// removing or changing a source rolls the Deployment.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Tokenizers []Tokenizer `json:"tokenizers,omitempty"`

	// replicas is the number of coordinator pods. It is the scale subresource's spec path, so a
	// HorizontalPodAutoscaler can target the CoordinatorPipeline.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	Replicas *int32 `json:"replicas,omitempty"`

	// image is the coordinator container image. When unset the operator uses its own default
	// (the manager's --coordinator-image flag), so upgrading the operator upgrades coordinators
	// that do not pin an image. Like every pod setting below, changing it rolls the Deployment.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`

	// imagePullPolicy of the coordinator container. Defaults to Kubernetes' own default
	// (Always for :latest, IfNotPresent otherwise).
	// +optional
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// resources of the coordinator container.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`

	// nodeSelector constrains coordinator pods to nodes with these labels.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// tolerations of the coordinator pods.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// affinity of the coordinator pods.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// topologySpreadConstraints of the coordinator pods. A constraint without a labelSelector
	// gets the coordinator pods' selector.
	// +optional
	// +listType=atomic
	TopologySpreadConstraints []corev1.TopologySpreadConstraint `json:"topologySpreadConstraints,omitempty"`

	// podLabels are added to the labels of the coordinator pods (the Deployment's pod template),
	// e.g. for a service mesh or cost attribution. The operator's own labels win:
	// app.kubernetes.io/name, app.kubernetes.io/instance (the pod selector) and
	// app.kubernetes.io/managed-by, and keys under coordinator.epd.dev/, are refused. Changing
	// them rolls the Deployment.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, !(k in ['app.kubernetes.io/name', 'app.kubernetes.io/instance', 'app.kubernetes.io/managed-by']) && !k.startsWith('coordinator.epd.dev/'))",message="podLabels must not set app.kubernetes.io/name, app.kubernetes.io/instance, app.kubernetes.io/managed-by or a coordinator.epd.dev/ key: the operator owns them (name and instance select the coordinator pods)"
	PodLabels map[string]string `json:"podLabels,omitempty"`

	// podAnnotations are added to the annotations of the coordinator pods, e.g. a service mesh's
	// injection settings or a secret injector's. Keys under coordinator.epd.dev/ and
	// kubectl.kubernetes.io/default-container are the operator's and are refused. Changing them
	// rolls the Deployment.
	// +optional
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('coordinator.epd.dev/') && k != 'kubectl.kubernetes.io/default-container')",message="podAnnotations must not set a coordinator.epd.dev/ key or kubectl.kubernetes.io/default-container: the operator owns them"
	PodAnnotations map[string]string `json:"podAnnotations,omitempty"`

	// env are extra environment variables of the coordinator container: values, or references to
	// Secret and ConfigMap keys and pod fields (valueFrom), e.g. a render service's token or the
	// OTEL_EXPORTER_OTLP_* settings of the trace exporter. COORDINATOR_* variables are refused:
	// they override the configuration the operator renders from this spec (set the spec field
	// instead). With tracing.resourceAttributes set, OTEL_RESOURCE_ATTRIBUTES is the operator's,
	// and with tracing.serviceName, OTEL_SERVICE_NAME. Changing env rolls the Deployment.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:XValidation:rule="self.all(e, !e.name.startsWith('COORDINATOR_'))",message="env must not set COORDINATOR_* variables: they override the configuration the operator renders from the spec; set the matching spec field instead"
	Env []corev1.EnvVar `json:"env,omitempty"`

	// envFrom adds every key of Secrets and ConfigMaps as environment variables of the
	// coordinator container. Variables of env win over them. COORDINATOR_* variables override
	// the configuration the operator renders from this spec: a prefix that could form one with a
	// key is refused (one starting with COORDINATOR_, or a start of it such as C or COORD; names
	// are case-sensitive). Without a prefix the keys are the names: the operator reads an
	// unprefixed ConfigMap and refuses a COORDINATOR_* key in it (PipelineValid=False, reason
	// EnvFromOverridesConfig), but never reads a Secret's data: keeping COORDINATOR_* keys out of
	// an unprefixed Secret is the user's responsibility. Changing envFrom rolls the Deployment (a
	// change of the Secret's or ConfigMap's content does not: restart the pods).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(e, !(has(e.prefix) && (e.prefix in ['C', 'CO', 'COO', 'COOR', 'COORD', 'COORDI', 'COORDIN', 'COORDINA', 'COORDINAT', 'COORDINATO', 'COORDINATOR'] || e.prefix.startsWith('COORDINATOR_'))))",message="envFrom prefix could form COORDINATOR_ names with the keys of its source: they would override the configuration the operator renders from the spec",messageExpression="'spec.envFrom[' + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '11', '12', '13', '14', '15'][self.map(e, has(e.prefix) && (e.prefix in ['C', 'CO', 'COO', 'COOR', 'COORD', 'COORDI', 'COORDIN', 'COORDINA', 'COORDINAT', 'COORDINATO', 'COORDINATOR'] || e.prefix.startsWith('COORDINATOR_'))).indexOf(true)] + '].prefix ' + (self.filter(e, has(e.prefix) && (e.prefix in ['C', 'CO', 'COO', 'COOR', 'COORD', 'COORDI', 'COORDIN', 'COORDINA', 'COORDINAT', 'COORDINATO', 'COORDINATOR'] || e.prefix.startsWith('COORDINATOR_')))[0].prefix.startsWith('COORDINATOR_') ? 'starts with COORDINATOR_: its variables' : '\"' + ['C', 'CO', 'COO', 'COOR', 'COORD', 'COORDI', 'COORDIN', 'COORDINA', 'COORDINAT', 'COORDINATO', 'COORDINATOR'].filter(p, p == self.filter(e, has(e.prefix) && (e.prefix in ['C', 'CO', 'COO', 'COOR', 'COORD', 'COORDI', 'COORDIN', 'COORDINA', 'COORDINAT', 'COORDINATO', 'COORDINATOR'] || e.prefix.startsWith('COORDINATOR_')))[0].prefix)[0] + '\" could form COORDINATOR_ names with the keys of its source: they') + ' would override the configuration the operator renders from the spec'"
	EnvFrom []corev1.EnvFromSource `json:"envFrom,omitempty"`

	// imagePullSecrets name Secrets in the pipeline's namespace with the credentials to pull the
	// coordinator image from a private registry.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// priorityClassName of the coordinator pods. The coordinator is on every request's path: a
	// class above the workers' keeps it from being preempted by them.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	PriorityClassName string `json:"priorityClassName,omitempty"`

	// serviceAccountName runs the coordinator pods as this ServiceAccount of the pipeline's
	// namespace (e.g. one bound to a cloud identity) instead of the one the operator creates,
	// named like the pipeline. The service-account token is still not mounted
	// (automountServiceAccountToken: false): the coordinator never calls the Kubernetes API.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	ServiceAccountName string `json:"serviceAccountName,omitempty"`

	// volumes are extra volumes of the coordinator pods, mounted with volumeMounts: e.g.
	// tokenizer files, certificates of a render service. The names config, tmp, tls and
	// gateway-ca are the operator's; hostPath volumes are refused (the coordinator pods run
	// under the restricted Pod Security profile). Changing volumes rolls the Deployment.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(v, !(v.name in ['config', 'tmp', 'tls', 'gateway-ca']))",message="volume names config, tmp, tls and gateway-ca are the operator's: choose another name"
	// +kubebuilder:validation:XValidation:rule="self.all(v, !has(v.hostPath))",message="hostPath volumes are not allowed: the coordinator pods run under the restricted Pod Security profile"
	Volumes []corev1.Volume `json:"volumes,omitempty"`

	// volumeMounts mount volumes of spec.volumes into the coordinator container. A mountPath
	// must be absolute and must not be, or be under, the operator's mounts: /etc/coordinator
	// (the configuration), /etc/coordinator-tls, /etc/coordinator-gateway-ca and /tmp; a mount
	// that reaches one of them only once cleaned (e.g. /etc//coordinator) is left out of the pod.
	// A mount of a volume not in spec.volumes is refused by the API server when the operator
	// writes the Deployment (Degraded, reason ReconcileError). Changing them rolls the Deployment.
	// +optional
	// +listType=map
	// +listMapKey=mountPath
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:XValidation:rule="self.all(m, m.mountPath.startsWith('/'))",message="volumeMounts mountPath must be an absolute path"
	// +kubebuilder:validation:XValidation:rule="self.all(m, !['/etc/coordinator', '/etc/coordinator-tls', '/etc/coordinator-gateway-ca', '/tmp'].exists(d, m.mountPath == d || m.mountPath.startsWith(d + '/')))",message="volumeMounts must not mount at or under /etc/coordinator, /etc/coordinator-tls, /etc/coordinator-gateway-ca or /tmp: the operator mounts the configuration, TLS files and scratch space there"
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`

	// tracing configures the coordinator's OpenTelemetry tracing (the tracing section of its
	// configuration, and OTEL_RESOURCE_ATTRIBUTES). Unset, tracing is off (trace context is
	// still propagated to every leg). The coordinator sets up tracing at start, so changing it
	// rolls the Deployment.
	// +optional
	Tracing *TracingSpec `json:"tracing,omitempty"`

	// logLevel is the coordinator's log verbosity (log_level): 1 warn, 2 info, 3 verbose,
	// 4 debug, 5 trace. Reloaded in place: changing it does not restart the pods.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=5
	LogLevel int32 `json:"logLevel,omitempty"`

	// server configures the coordinator's HTTP server. Changing its timeouts rolls the
	// Deployment.
	// +optional
	Server ServerSpec `json:"server,omitempty"`

	// route, when set, makes the operator create a Gateway API HTTPRoute that sends client
	// requests to the coordinator Service and the coordinator's legs (requests carrying an
	// EPP-Profile header) to the InferencePool. The RouteAccepted condition reports whether the
	// gateway accepted it. Removing route deletes the HTTPRoute.
	// +optional
	Route *RouteSpec `json:"route,omitempty"`

	// disruptionBudget, when set, makes the operator create a PodDisruptionBudget for the
	// coordinator pods. Removing it deletes the PodDisruptionBudget.
	// +optional
	DisruptionBudget *DisruptionBudgetSpec `json:"disruptionBudget,omitempty"`

	// autoscaling, when set, makes the operator create a HorizontalPodAutoscaler (autoscaling/v2)
	// that scales the coordinators between minReplicas and maxReplicas on their CPU and on the
	// requests each serves. It targets this CoordinatorPipeline's scale subresource, not the
	// Deployment: the autoscaler writes spec.replicas and the operator carries it to the
	// Deployment, so the Deployment's replicas have one writer and spec.replicas,
	// status.replicas and status.readyFraction stay the truth. Leave spec.replicas out of
	// manifests you apply while it is set, or your apply and the autoscaler take turns.
	// Removing it deletes the HorizontalPodAutoscaler; spec.replicas keeps its last value.
	// +optional
	Autoscaling *AutoscalingSpec `json:"autoscaling,omitempty"`

	// networkPolicy, when set and enabled, makes the operator create a NetworkPolicy for the
	// coordinator pods. Disabling or removing it deletes the NetworkPolicy.
	// +optional
	NetworkPolicy *NetworkPolicySpec `json:"networkPolicy,omitempty"`

	// rateLimit limits each tenant's requests per second and tokens per minute across every
	// coordinator replica through a shared Redis (the configuration's rate_limit block): over a
	// limit a request gets 429 with Retry-After and OpenAI's x-ratelimit-* headers. Reloaded in
	// place; needs a coordinator of configuration schema 6.
	// +optional
	RateLimit *RateLimitSpec `json:"rateLimit,omitempty"`
}

// RateLimitSpec is the data plane's rate_limit block (docs/configuration.md).
type RateLimitSpec struct {
	// redisURL is the Redis every replica shares (redis://, rediss:// or unix://), e.g.
	// redis://redis.infra:6379/0.
	// +required
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:Pattern=`^(redis|rediss|unix)://`
	RedisURL string `json:"redisURL"`

	// passwordEnv names an environment variable of the coordinator container holding the Redis
	// password (set it with spec.env from a Secret: the operator never reads Secrets).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z_][A-Za-z0-9_]*$`
	PasswordEnv string `json:"passwordEnv,omitempty"`

	// tenantHeader names the request header whose value is the tenant (a header the edge sets
	// after authentication). Unset: spec.server.metricsTenantHeader, which must then be set.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][-A-Za-z0-9]*$`
	TenantHeader string `json:"tenantHeader,omitempty"`

	// redisTimeout bounds each Redis call of the limit check (default 100ms, at most 10s); past
	// it the check fails over to onRedisFailure for a second.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Format=duration
	RedisTimeout *metav1.Duration `json:"redisTimeout,omitempty"`

	// keyPrefix prefixes the limiter's Redis keys (default coordinator:ratelimit:).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	KeyPrefix string `json:"keyPrefix,omitempty"`

	// onRedisFailure is what the check does while Redis fails or does not answer: local (the
	// default) enforces the limits in each replica alone (a tenant may get up to replicas times
	// its limits), open admits every request, closed refuses limited requests with 503.
	// +optional
	// +kubebuilder:validation:Enum=local;open;closed
	OnRedisFailure string `json:"onRedisFailure,omitempty"`

	// default limits every tenant tenants does not list, together (one bucket for all of
	// them). Unset: those tenants are not limited.
	// +optional
	Default *TenantLimits `json:"default,omitempty"`

	// tenants are the tenants with limits, or a scheduling objective, of their own.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=1000
	Tenants []TenantSpec `json:"tenants,omitempty"`
}

// TenantLimits are a tenant's limits; an unset limit is no limit.
type TenantLimits struct {
	// requestsPerSecond is the sustained request rate (a quantity: "10", "0.5", "500m"); up to
	// one second's worth, at least one request, may come at once.
	// +optional
	RequestsPerSecond *resource.Quantity `json:"requestsPerSecond,omitempty"`

	// tokensPerMinute bounds prompt plus completion tokens: a request reserves its prompt's
	// estimate, settled on its answer's usage; a minute's worth may come at once.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	TokensPerMinute *int64 `json:"tokensPerMinute,omitempty"`
}

// TenantSpec is one tenant's limits and scheduling objective.
type TenantSpec struct {
	// name is the tenant header's value.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self != '*'",message="* is the bucket of the tenants not listed: use default"
	Name string `json:"name"`

	TenantLimits `json:",inline"`

	// objective, when set, is sent as the endpoint picker's objective header
	// (x-gateway-inference-objective) on every leg of the tenant's requests: the
	// InferenceObjective, and so the priority, its requests are scheduled with. A client's own
	// objective header is always dropped.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[!-~]+$`
	Objective string `json:"objective,omitempty"`
}

// CoordinatorPipelineStatus is the observed state of a CoordinatorPipeline.
type CoordinatorPipelineStatus struct {
	// observedGeneration is the metadata.generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready, Progressing, RolledOut, Degraded, PipelineValid, InferencePoolResolved,
	// GatewayResolved and, when spec.route is set, RouteAccepted.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// configRevision is the revision (a fingerprint of the effective configuration) of the
	// configuration in the ConfigMap, the one the coordinators serve or are loading. The
	// coordinators report the same value for the configuration they loaded. While the spec's
	// pipeline is invalid it stays at the last applied revision.
	// +optional
	ConfigRevision string `json:"configRevision,omitempty"`

	// pipelineSteps lists the step types of the applied configuration, comma-separated.
	// +optional
	PipelineSteps string `json:"pipelineSteps,omitempty"`

	// gatewayAddress is the gateway base URL of the applied configuration.
	// +optional
	GatewayAddress string `json:"gatewayAddress,omitempty"`

	// replicas is the number of coordinator pods, from the Deployment (the scale subresource's
	// status path). Like the other counts it is written as 0 rather than left out, so that the
	// printed columns show 0.
	// +optional
	// +kubebuilder:default=0
	Replicas int32 `json:"replicas"`

	// updatedReplicas is the number of ready coordinator pods that report (GET /debug/pipeline
	// on their admin port) serving configRevision, with no setting of it waiting for a restart.
	// The coordinators reload their configuration in place, so the Deployment cannot tell this;
	// a pod that cannot be asked is not counted.
	// +optional
	// +kubebuilder:default=0
	UpdatedReplicas int32 `json:"updatedReplicas"`

	// readyReplicas is the number of ready coordinator pods, from the Deployment.
	// +optional
	// +kubebuilder:default=0
	ReadyReplicas int32 `json:"readyReplicas"`

	// readyFraction is readyReplicas over the desired replicas (spec.replicas), e.g. "2/2".
	// +optional
	ReadyFraction string `json:"readyFraction,omitempty"`

	// url is the in-cluster URL of the coordinator Service that clients call, e.g.
	// http://epd.llm-d.svc:8080 (https with spec.server.tls).
	// +optional
	URL string `json:"url,omitempty"`

	// selector is the label selector of the coordinator pods, in string form (the scale
	// subresource's selector path, used by HorizontalPodAutoscalers).
	// +optional
	Selector string `json:"selector,omitempty"`

	// revisions are the pipelines of the applied configuration: the stable one and, with
	// spec.canary, the canary, each with its share and what the ready pods report it served.
	// Refreshed at least every 30 seconds while a canary runs.
	// +optional
	// +listType=map
	// +listMapKey=track
	// +kubebuilder:validation:MaxItems=2
	Revisions []PipelineRevisionStatus `json:"revisions,omitempty"`
}

// CoordinatorPipeline runs the E/P/D coordinator in front of an InferencePool: the operator
// renders the pipeline into the coordinator's configuration (a ConfigMap), runs the coordinator
// Deployment with a Service and a ServiceAccount (optionally an HTTPRoute, a PodDisruptionBudget
// and a NetworkPolicy), and reports the rendered configuration's revision and the rollout in
// status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=cpl,categories=epd
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.readyFraction`
// +kubebuilder:printcolumn:name="Updated",type=integer,JSONPath=`.status.updatedReplicas`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Rollout",type=string,JSONPath=`.status.conditions[?(@.type=="RolledOut")].reason`,priority=1
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.status.url`
// +kubebuilder:printcolumn:name="Revision",type=string,JSONPath=`.status.configRevision`
// +kubebuilder:printcolumn:name="Canary",type=integer,JSONPath=`.status.revisions[?(@.track=="canary")].weightPercent`,priority=1
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.inferencePoolRef.name`,priority=1
// +kubebuilder:printcolumn:name="Steps",type=string,JSONPath=`.status.pipelineSteps`,priority=1
// +kubebuilder:printcolumn:name="Gateway",type=string,JSONPath=`.status.gatewayAddress`,priority=1
// +kubebuilder:printcolumn:name="Route",type=string,JSONPath=`.status.conditions[?(@.type=="RouteAccepted")].status`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS-1035 label (at most 63 lowercase letters, digits and '-', starting with a letter): it names the coordinator Service"
type CoordinatorPipeline struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired state.
	// +required
	Spec CoordinatorPipelineSpec `json:"spec"`

	// status is the observed state, written by the operator.
	// +optional
	Status CoordinatorPipelineStatus `json:"status,omitempty"`
}

// CoordinatorPipelineList is a list of CoordinatorPipelines.
//
// +kubebuilder:object:root=true
type CoordinatorPipelineList struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// items are the CoordinatorPipelines.
	Items []CoordinatorPipeline `json:"items"`
}
