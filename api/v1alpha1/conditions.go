package v1alpha1

// ConditionType is the type of a CoordinatorPipeline status condition.
type ConditionType string

// Condition types of a CoordinatorPipeline.
const (
	// ConditionReady summarizes the others: True when the pipeline is valid, the gateway and the
	// InferencePool are resolved, every desired coordinator pod runs the current pod template
	// and is available, and, with spec.route, the gateway accepted the HTTPRoute.
	ConditionReady ConditionType = "Ready"
	// ConditionProgressing is True while the coordinator Deployment rolls out or scales.
	ConditionProgressing ConditionType = "Progressing"
	// ConditionDegraded is True when the operator cannot apply the spec: an invalid pipeline (the
	// last good configuration keeps serving), a failed rollout, a conflicting object or an API
	// error.
	ConditionDegraded ConditionType = "Degraded"
	// ConditionPipelineValid reports whether the spec's pipeline builds with the data plane's own
	// code (every step with its params).
	ConditionPipelineValid ConditionType = "PipelineValid"
	// ConditionInferencePoolResolved reports whether the referenced InferencePool exists and
	// mirrors its parents' Accepted and ResolvedRefs conditions.
	ConditionInferencePoolResolved ConditionType = "InferencePoolResolved"
	// ConditionGatewayResolved reports whether the gateway address is known (set explicitly or
	// read from the referenced Gateway's status).
	ConditionGatewayResolved ConditionType = "GatewayResolved"
	// ConditionRouteAccepted (only with spec.route) mirrors the HTTPRoute's Accepted condition
	// for its parent Gateway, as written by the gateway controller: Unknown until one reports,
	// False when the route is rejected or its backends do not resolve (ResolvedRefs=False).
	ConditionRouteAccepted ConditionType = "RouteAccepted"
	// ConditionRolledOut reports whether the coordinators serve status.configRevision: True when
	// every desired replica is ready and every ready coordinator pod reports (on its admin port,
	// GET /debug/pipeline) that it serves that revision. The coordinators reload the
	// configuration without a restart, so the Deployment's status cannot tell this.
	ConditionRolledOut ConditionType = "RolledOut"
)

// ConditionReason is the CamelCase reason of a CoordinatorPipeline status condition.
type ConditionReason string

// Reasons of the Ready condition.
const (
	// ReasonReady: Ready=True.
	ReasonReady ConditionReason = "Ready"
	// ReasonGatewayNotResolved: Ready=False because GatewayResolved is False.
	ReasonGatewayNotResolved ConditionReason = "GatewayNotResolved"
	// ReasonInferencePoolNotResolved: Ready=False because InferencePoolResolved is False.
	ReasonInferencePoolNotResolved ConditionReason = "InferencePoolNotResolved"
	// ReasonDeploymentNotReady: Ready=False because the coordinator Deployment has not rolled out
	// the current pod template to every desired replica, or some are unavailable.
	ReasonDeploymentNotReady ConditionReason = "DeploymentNotReady"
	// ReasonNoValidConfig: no valid configuration has ever been rendered, so there is no
	// coordinator Deployment yet.
	ReasonNoValidConfig ConditionReason = "NoValidConfig"
	// ReasonRouteNotAccepted: Ready=False because spec.route is set and RouteAccepted is not True.
	ReasonRouteNotAccepted ConditionReason = "RouteNotAccepted"
	// ReasonTLSSecretNotFound: Ready=False because the Secret of spec.server.tls.secretName does
	// not exist: new coordinator pods cannot mount it and stay ContainerCreating.
	ReasonTLSSecretNotFound ConditionReason = "TLSSecretNotFound"
	// ReasonCABundleNotFound: Ready=False because the ConfigMap of
	// spec.gateway.caBundle.configMapName does not exist: new coordinator pods cannot mount it.
	ReasonCABundleNotFound ConditionReason = "CABundleNotFound"
)

// Reasons of the PipelineValid condition (ReasonInvalidPipeline is also used by Ready and
// Degraded).
const (
	// ReasonValid: PipelineValid=True.
	ReasonValid ConditionReason = "Valid"
	// ReasonInvalidPipeline: the pipeline does not build; the message is the data plane's error,
	// naming the key (e.g. pipeline.steps[2].params.max_parallel: must be at least 1, got 0).
	ReasonInvalidPipeline ConditionReason = "InvalidPipeline"
	// ReasonConfigSchemaUnsupported: spec.image declares (annotation
	// coordinator.epd.dev/config-schema) a configuration schema older than the one the operator
	// renders, or the annotation is not a number. Nothing is changed until it is fixed: the
	// coordinators keep their image and configuration. Also used by Ready and Degraded.
	ReasonConfigSchemaUnsupported ConditionReason = "ConfigSchemaUnsupported"
	// ReasonTokenizerNotFound: the ConfigMap of a spec.tokenizers entry does not exist, so the
	// pipeline cannot be validated with its files and new coordinator pods could not mount it.
	// Nothing is changed until it exists: the coordinators keep their pod template and
	// configuration. Also used by Ready and Degraded.
	ReasonTokenizerNotFound ConditionReason = "TokenizerNotFound"
	// ReasonEnvFromOverridesConfig: a ConfigMap of spec.envFrom without a prefix has a key
	// beginning COORDINATOR_, which would override the configuration the operator renders.
	// Nothing is changed until the key is gone: the coordinators keep their pod template and
	// configuration. Also used by Ready and Degraded.
	ReasonEnvFromOverridesConfig ConditionReason = "EnvFromOverridesConfig"
)

// Reasons of the RouteAccepted condition (it also uses ReasonNotAccepted, ReasonRefsNotResolved
// and ReasonAPIUnavailable).
const (
	// ReasonAccepted: RouteAccepted=True, the parent Gateway accepted the HTTPRoute and resolved
	// its backends.
	ReasonAccepted ConditionReason = "Accepted"
	// ReasonPending: RouteAccepted=Unknown, no gateway controller has reported on the HTTPRoute
	// for its parent yet.
	ReasonPending ConditionReason = "Pending"
)

// Reasons of the InferencePoolResolved and GatewayResolved conditions.
const (
	// ReasonResolved: the referenced object exists and reports no problem.
	ReasonResolved ConditionReason = "Resolved"
	// ReasonNotFound: the referenced object does not exist.
	ReasonNotFound ConditionReason = "NotFound"
	// ReasonNotAccepted: a parent of the InferencePool (or of the HTTPRoute) reports
	// Accepted=False.
	ReasonNotAccepted ConditionReason = "NotAccepted"
	// ReasonRefsNotResolved: a parent of the InferencePool (or of the HTTPRoute) reports
	// ResolvedRefs=False.
	ReasonRefsNotResolved ConditionReason = "RefsNotResolved"
	// ReasonAPIUnavailable: the referenced kind's CRD is not installed in the cluster (or was not
	// when the operator started).
	ReasonAPIUnavailable ConditionReason = "APIUnavailable"
	// ReasonAddressSet: GatewayResolved=True from spec.gateway.address.
	ReasonAddressSet ConditionReason = "AddressSet"
	// ReasonAddressPending: the Gateway has no usable status address yet.
	ReasonAddressPending ConditionReason = "AddressPending"
	// ReasonListenerNotFound: the Gateway has no matching HTTP or HTTPS listener.
	ReasonListenerNotFound ConditionReason = "ListenerNotFound"
	// ReasonNamespaceNotWatched: the referenced Gateway is outside the one namespace the operator
	// watches (--watch-namespace), so it cannot read it.
	ReasonNamespaceNotWatched ConditionReason = "NamespaceNotWatched"
	// ReasonAddressNotAllowed: the gateway address's host is refused (loopback, unspecified,
	// link-local, a cloud metadata service, localhost, or an IP in a non-canonical form), whether
	// it comes from spec.gateway.address or from the referenced Gateway's status.
	ReasonAddressNotAllowed ConditionReason = "AddressNotAllowed"
)

// Reasons of the Progressing and Degraded conditions.
const (
	// ReasonRollingOut: Progressing=True while the Deployment rolls out or scales.
	ReasonRollingOut ConditionReason = "RollingOut"
	// ReasonRolloutComplete: Progressing=False, the Deployment is steady.
	ReasonRolloutComplete ConditionReason = "RolloutComplete"
	// ReasonProgressDeadlineExceeded: the Deployment's rollout stalled
	// (Progressing=False and Degraded=True).
	ReasonProgressDeadlineExceeded ConditionReason = "ProgressDeadlineExceeded"
	// ReasonAsExpected: Degraded=False.
	ReasonAsExpected ConditionReason = "AsExpected"
	// ReasonReconcileError: an API call failed; the operator retries with backoff.
	ReasonReconcileError ConditionReason = "ReconcileError"
	// ReasonChildConflict: an object the operator would create exists and is not controlled by
	// this CoordinatorPipeline.
	ReasonChildConflict ConditionReason = "ChildConflict"
)

// Reasons of the RolledOut condition (it also uses ReasonNoValidConfig).
const (
	// ReasonRolledOut: RolledOut=True, every desired replica is ready and serves the current
	// configuration revision.
	ReasonRolledOut ConditionReason = "RolledOut"
	// ReasonProgressing: RolledOut=False, some ready pods still serve an older revision (the
	// kubelet has not refreshed the mounted ConfigMap yet, or the pod has not reloaded it), wait
	// for a restart the new revision needs, or fewer replicas than desired are ready.
	ReasonProgressing ConditionReason = "Progressing"
	// ReasonConfigRejected: RolledOut=False, a coordinator pod rejected the current revision and
	// keeps serving its last good one; the message names the pods (a few) and their errors.
	ReasonConfigRejected ConditionReason = "ConfigRejected"
	// ReasonRevisionUnknown: RolledOut=Unknown, some ready pods could not be asked which
	// revision they serve (not reachable, no admin port, or an unreadable answer).
	ReasonRevisionUnknown ConditionReason = "Unknown"
)
