// Package controller holds the CoordinatorPipeline reconciler. It renders a CoordinatorPipeline
// into the data plane's configuration (validated with the data plane's own pipeline builder) and
// runs it as a ConfigMap, a Deployment, a Service and a ServiceAccount, plus, on request, an
// HTTPRoute, a PodDisruptionBudget, a HorizontalPodAutoscaler and a NetworkPolicy, all owned by
// the CoordinatorPipeline.
// Children are built by pure desiredX functions (children.go, exposure.go) and applied
// server-side (apply.go), status by pure setters (coordinatorpipeline_status.go); Reconcile only
// sequences reads and writes.
package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// ControllerName names the controller (logs, metrics, events' reporting controller).
const ControllerName = "coordinatorpipeline"

// Field indexes on CoordinatorPipelines, used to map a changed InferencePool or Gateway to the
// pipelines that reference it.
const (
	indexInferencePool = "spec.inferencePoolRef.name"
	indexGateway       = "spec.gateway.gatewayRef"
	// indexTokenizerConfigMap maps a ConfigMap to the pipelines of its namespace whose
	// spec.tokenizers read it.
	indexTokenizerConfigMap = "spec.tokenizers.configMap.name"
)

var (
	inferencePoolGK = schema.GroupKind{Group: infv1.GroupVersion.Group, Kind: "InferencePool"}
	gatewayGK       = schema.GroupKind{Group: gatewayv1.GroupVersion.Group, Kind: "Gateway"}
	httpRouteGK     = schema.GroupKind{Group: gatewayv1.GroupVersion.Group, Kind: "HTTPRoute"}
)

// CoordinatorPipelineReconciler reconciles CoordinatorPipelines.
type CoordinatorPipelineReconciler struct {
	client.Client
	// APIReader reads past the cache (after an AlreadyExists). Defaults to the manager's.
	APIReader client.Reader
	// Recorder emits events. Defaults to the manager's recorder for ControllerName.
	Recorder events.EventRecorder
	// DefaultImage is the coordinator image for pipelines that do not set spec.image.
	DefaultImage string
	// WatchNamespace is the one namespace the manager's cache sees (CacheOptions), empty for
	// all: a gatewayRef to a Gateway elsewhere cannot be read and is reported as such.
	WatchNamespace string
	// PipelineStatus asks a coordinator pod which configuration it serves (GET /debug/pipeline
	// on its admin port). Defaults to HTTPPipelineStatusGetter.
	PipelineStatus PipelineStatusGetter
	// OperatorNamespace is the namespace the operator runs in ("" when unknown): a pipeline's
	// NetworkPolicy admits it to the admin port, which the rollout probe asks.
	OperatorNamespace string
	// CanaryStatusInterval is how often status.revisions is refreshed while a canary runs
	// (DefaultCanaryStatusInterval when 0): its counts change with traffic, which no object
	// records.
	CanaryStatusInterval time.Duration

	// referencedConfigMaps reads the metadata of the ConfigMaps of spec.tokenizers and of the
	// unprefixed spec.envFrom (their version), from a cache of its own: the manager's caches only
	// the operator's ConfigMaps. Nil (the reconciler not set up with a manager): every read goes
	// to APIReader.
	referencedConfigMaps client.Reader
	// tokenizerCopies are the local copies of the ConfigMap tokenizers' files the pipeline is
	// validated with.
	tokenizerCopies tokenizerCopies
	// envFromChecks are the checked versions of the unprefixed envFrom ConfigMaps.
	envFromChecks envFromChecks

	// poolAPI, gatewayAPI and routeAPI record whether the InferencePool, Gateway and HTTPRoute
	// CRDs were installed at start-up; without them references cannot resolve, routes cannot be
	// created, and nothing is watched.
	poolAPI, gatewayAPI, routeAPI bool
}

// scope carries one reconcile's object and findings between phases.
type scope struct {
	cp *coordinatorv1alpha1.CoordinatorPipeline
	// before is cp as read: the status patch is computed against it.
	before *coordinatorv1alpha1.CoordinatorPipeline
	// rendered is the spec's configuration when it is valid and complete (gateway resolved).
	rendered *config.Config
	obs      observed
}

// phase is one step of a reconcile. Every input is watched, so phases never ask for a timed
// requeue: they return an error (retried with backoff) or nil. (The one exception is what the
// coordinator pods report, which Reconcile reads once the status is computed: requeueAfter.)
// A phase whose findings feed the
// status records them as found(...) in the scope's observed results; the results of phases that
// did not run stay zero.
type phase struct {
	// name says what the phase reconciles; its errors read "failed to reconcile <name>: ...".
	name string
	run  func(ctx context.Context, s *scope) error
}

// phases are the reconcile's phases, in order. References are resolved and the configuration
// rendered first; the NetworkPolicy is applied before the Deployment so that new coordinator pods
// start behind it.
func (r *CoordinatorPipelineReconciler) phases() []phase {
	return []phase{
		{"InferencePool reference", r.resolveInferencePool},
		{"gateway address", r.resolveGateway},
		{"TLS references", r.resolveTLSReferences},
		{"pipeline configuration", r.renderAndValidate},
		{"ServiceAccount", r.reconcileServiceAccount},
		{"ConfigMap", r.reconcileConfigMap},
		{"Service", r.reconcileService},
		{"NetworkPolicy", r.reconcileNetworkPolicy},
		{"PodDisruptionBudget", r.reconcilePodDisruptionBudget},
		{"HorizontalPodAutoscaler", r.reconcileHorizontalPodAutoscaler},
		{"Deployment", r.reconcileDeployment},
		{"HTTPRoute", r.reconcileRoute},
		{"coordinator pods", r.reconcilePodRevisions},
	}
}

// +kubebuilder:rbac:groups=coordinator.epd.dev,resources=coordinatorpipelines,verbs=get;list;watch
// +kubebuilder:rbac:groups=coordinator.epd.dev,resources=coordinatorpipelines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=coordinator.epd.dev,resources=coordinatorpipelines/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=configmaps;services;serviceaccounts,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=apps,resources=replicasets,verbs=get;list;watch
// +kubebuilder:rbac:groups=inference.networking.k8s.io,resources=inferencepools,verbs=get;list;watch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=gateways,verbs=get;list;watch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings a CoordinatorPipeline's children in line with its spec and writes its status
// once, at the end, only when it changed.
func (r *CoordinatorPipelineReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cp := &coordinatorv1alpha1.CoordinatorPipeline{}
	if err := r.Get(ctx, req.NamespacedName, cp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(forgetDeleted(req.NamespacedName, err)) // gone: drop its metrics
	}
	if !cp.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil // children carry owner references: the garbage collector removes them
	}

	s := &scope{cp: cp, before: cp.DeepCopy()}
	if err := r.patchStatus(ctx, s, r.runPhases(ctx, s)); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: r.requeueAfter(s)}, nil
}

// runPhases runs the phases in order and stops at the first that fails.
func (r *CoordinatorPipelineReconciler) runPhases(ctx context.Context, s *scope) error {
	for _, p := range r.phases() {
		if err := p.run(ctx, s); err != nil {
			return fmt.Errorf("failed to reconcile %s: %w", p.name, err)
		}
	}
	return nil
}

// requeueAfter is when a reconcile whose phases all ran asks the coordinator pods again: a
// coordinator's reload changes no object, so while the pods have not all loaded the current
// revision (revisionRollout.requeue), and every CanaryStatusInterval while a canary runs (its
// counts change with traffic alone). Zero otherwise: every other input is watched.
func (r *CoordinatorPipelineReconciler) requeueAfter(s *scope) time.Duration {
	if !s.obs.pods.ran {
		return 0
	}
	after := revisionRolloutOf(s.cp, s.obs.pods.value).requeue
	if every := cmp.Or(r.CanaryStatusInterval, DefaultCanaryStatusInterval); len(s.cp.Status.Revisions) > 1 && (after == 0 || after > every) {
		after = every
	}
	return after
}

// resolveInferencePool looks up spec.inferencePoolRef.
func (r *CoordinatorPipelineReconciler) resolveInferencePool(ctx context.Context, s *scope) error {
	name := s.cp.Spec.InferencePoolRef.Name
	var res resolution
	if !r.poolAPI {
		res = apiUnavailable("InferencePool", infv1.GroupVersion.String())
	} else {
		pool := &infv1.InferencePool{}
		err := r.Get(ctx, client.ObjectKey{Namespace: s.cp.Namespace, Name: name}, pool)
		switch {
		case apierrors.IsNotFound(err):
			res = missingPool(s.cp.Namespace, name)
		case err != nil:
			return fmt.Errorf("reading InferencePool %s: %w", name, err)
		default:
			res = summarizePool(pool)
		}
	}
	s.obs.pool = found(res)
	return nil
}

// resolveGateway determines the gateway address: spec.gateway.address, or the referenced
// Gateway's status address.
func (r *CoordinatorPipelineReconciler) resolveGateway(ctx context.Context, s *scope) error {
	spec := s.cp.Spec.Gateway
	var res resolution
	switch {
	case spec.GatewayRef == nil:
		res = explicitGateway(spec.Address)
	case !r.gatewayAPI:
		res = apiUnavailable("Gateway", gatewayv1.GroupVersion.String())
	case r.WatchNamespace != "" && gatewayNamespace(s.cp) != r.WatchNamespace:
		ns, name := gatewayKey(s.cp)
		res = resolution{reason: coordinatorv1alpha1.ReasonNamespaceNotWatched, message: fmt.Sprintf(
			"spec.gateway.gatewayRef.namespace: Gateway %s/%s is outside namespace %s, the only one the operator watches (--watch-namespace)", ns, name, r.WatchNamespace)}
	default:
		ns, name := gatewayKey(s.cp)
		gw := &gatewayv1.Gateway{}
		err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, gw)
		switch {
		case apierrors.IsNotFound(err):
			res = missingGateway(ns, name)
		case err != nil:
			return fmt.Errorf("reading Gateway %s/%s: %w", ns, name, err)
		default:
			res = resolveGatewayAddress(gw, *spec.GatewayRef)
		}
	}
	s.obs.gateway = found(res)
	return nil
}

// resolveTLSReferences checks that the Secret of spec.server.tls and the ConfigMap of
// spec.gateway.caBundle exist: without them new coordinator pods cannot mount their volumes and
// stay ContainerCreating, which the Deployment's status does not explain. It reads their metadata
// only, straight from the API server: the manager caches only its own children, and never reads a
// Secret's data. Neither is watched; when a missing one appears, the pods start and the
// Deployment's status change brings a reconcile.
func (r *CoordinatorPipelineReconciler) resolveTLSReferences(ctx context.Context, s *scope) error {
	res := resolution{ok: true}
	ns := s.cp.Namespace
	if t := s.cp.Spec.Server.TLS; t != nil {
		ok, err := r.exists(ctx, "Secret", ns, t.SecretName)
		if err != nil {
			return err
		}
		if !ok {
			res = resolution{reason: coordinatorv1alpha1.ReasonTLSSecretNotFound, message: fmt.Sprintf(
				"spec.server.tls.secretName: Secret %s not found in namespace %s; coordinator pods cannot start until it exists", t.SecretName, ns)}
		}
	}
	if ca := s.cp.Spec.Gateway.CABundle; ca != nil && res.ok {
		ok, err := r.exists(ctx, "ConfigMap", ns, ca.ConfigMapName)
		if err != nil {
			return err
		}
		if !ok {
			res = resolution{reason: coordinatorv1alpha1.ReasonCABundleNotFound, message: fmt.Sprintf(
				"spec.gateway.caBundle.configMapName: ConfigMap %s not found in namespace %s; coordinator pods cannot start until it exists", ca.ConfigMapName, ns)}
		}
	}
	s.obs.tls = found(res)
	return nil
}

// exists reports whether the core/v1 object kind namespace/name exists, reading its metadata
// only, past the cache.
func (r *CoordinatorPipelineReconciler) exists(ctx context.Context, kind, namespace, name string) (bool, error) {
	obj := &metav1.PartialObjectMetadata{}
	obj.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind(kind))
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading %s %s: %w", kind, name, err)
	}
	return true, nil
}

// renderAndValidate renders the spec into the data-plane configuration and validates its
// pipeline with the data plane's builder. An unresolved gateway does not stop validation (a
// placeholder address stands in), but such a configuration is not applied. A coordinator image
// that declares a configuration schema older than the rendered configuration needs
// (checkImageSchema) is refused.
//
// A render step's tokenizer must be the directory of a spec.tokenizers entry (checkTokenizerDirs).
// The files of ConfigMap tokenizers are read (loadTokenizers): a missing ConfigMap is reported
// (tokenizerNotFoundError), and the pipeline is built with a local copy of the files, each step
// using one carrying the ConfigMap's fingerprint as tokenizer_revision. An unprefixed ConfigMap of
// spec.envFrom with a COORDINATOR_* key is refused (envFromOverride). The only error is an API
// failure reading those ConfigMaps.
func (r *CoordinatorPipelineReconciler) renderAndValidate(ctx context.Context, s *scope) error {
	gw := s.obs.gateway.value
	address := validationGatewayAddress
	if gw.ok {
		address = gw.address
	}
	cfg, err := renderConfig(s.cp, address)
	if err == nil {
		schema, key := cfg.NeededSchema()
		err = checkImageSchema(s.cp, schema, key)
	}
	steps := tokenizerSteps(&cfg)
	if err == nil {
		err = checkTokenizerDirs(s.cp, steps)
	}
	if err == nil {
		override, oerr := r.envFromOverride(ctx, s.cp)
		if oerr != nil {
			return oerr
		}
		if override != nil {
			err = override
		}
	}
	var dirs localDirs
	if err == nil {
		loaded, lerr := r.loadTokenizers(ctx, s.cp, steps)
		if lerr != nil {
			return lerr
		}
		defer loaded.release()
		if loaded.missing != nil {
			err = loaded.missing
		} else {
			setTokenizerRevisions(s.cp, steps, loaded.revisions)
			dirs = loaded.dirs
		}
	}
	if err == nil {
		err = validatePipeline(cfg, dirs)
	}
	s.obs.pipeline = found(err)
	if err == nil {
		s.obs.podCheckedTokenizers = podCheckedTokenizers(s.cp, steps)
	}
	if err == nil && gw.ok {
		s.rendered = &cfg
	}
	return nil
}

func (r *CoordinatorPipelineReconciler) reconcileServiceAccount(ctx context.Context, s *scope) error {
	_, _, err := ensureChild(ctx, r, s.cp, desiredServiceAccount(s.cp))
	return err
}

// reconcileConfigMap writes a valid rendered configuration. Without one it leaves the ConfigMap
// alone, and the configuration already in it (the last good one, if any) stays the applied one.
func (r *CoordinatorPipelineReconciler) reconcileConfigMap(ctx context.Context, s *scope) error {
	if s.rendered == nil {
		live, err := getChild[corev1.ConfigMap](ctx, r, s.cp, configMapName(s.cp))
		if err != nil {
			return err
		}
		var applied *config.Config
		if live != nil {
			if cfg, err := parseConfig(live.Data[ConfigKey]); err == nil {
				applied = &cfg
			}
		}
		s.obs.applied = found(applied)
		return nil
	}
	rendered, err := marshalConfig(s.cp, *s.rendered)
	if err != nil {
		return fmt.Errorf("rendering the configuration: %w", err)
	}
	revision := s.rendered.Revision()
	_, res, err := ensureChild(ctx, r, s.cp, desiredConfigMap(s.cp, rendered, revision))
	if err != nil {
		return err
	}
	if res != unchanged {
		r.Recorder.Eventf(s.cp, nil, corev1.EventTypeNormal, "ConfigApplied", "ApplyConfig",
			"configuration revision %s %s in ConfigMap %s (steps: %s)", revision, res, configMapName(s.cp), stepSummary(*s.rendered))
	}
	s.obs.applied = found(s.rendered)
	return nil
}

// reconcileService exposes the API port, named for the applied configuration (https with TLS).
func (r *CoordinatorPipelineReconciler) reconcileService(ctx context.Context, s *scope) error {
	if _, _, err := ensureChild(ctx, r, s.cp, desiredService(s.cp, s.obs.applied.value)); err != nil {
		return err
	}
	s.obs.serviceURL = found(serviceURL(s.cp, s.obs.applied.value))
	return nil
}

// reconcileDeployment runs the coordinators with the applied configuration. With no valid
// configuration ever rendered there is nothing to run. A refused coordinator image, a missing
// tokenizer ConfigMap or tokenizer files that do not load leave the Deployment as it is
// (holdsDeployment): its new pods would reject the configuration, or not start.
func (r *CoordinatorPipelineReconciler) reconcileDeployment(ctx context.Context, s *scope) error {
	var dep *appsv1.Deployment
	var err error
	if applied := s.obs.applied.value; applied == nil || holdsDeployment(s.obs.pipeline.value) {
		dep, err = getChild[appsv1.Deployment](ctx, r, s.cp, s.cp.Name)
	} else {
		dep, _, err = ensureChild(ctx, r, s.cp, desiredDeployment(s.cp, *applied, r.DefaultImage))
	}
	if err != nil {
		return err
	}
	s.obs.deployment = found(dep)
	return nil
}

// reconcileNetworkPolicy creates, updates or deletes the NetworkPolicy of spec.networkPolicy.
func (r *CoordinatorPipelineReconciler) reconcileNetworkPolicy(ctx context.Context, s *scope) error {
	if !networkPolicyEnabled(s.cp) {
		return deleteChild[networkingv1.NetworkPolicy](ctx, r, s.cp, s.cp.Name)
	}
	_, _, err := ensureChild(ctx, r, s.cp, desiredNetworkPolicy(s.cp, s.obs.applied.value, r.OperatorNamespace))
	return err
}

// reconcilePodDisruptionBudget creates, updates or deletes the PodDisruptionBudget of
// spec.disruptionBudget.
func (r *CoordinatorPipelineReconciler) reconcilePodDisruptionBudget(ctx context.Context, s *scope) error {
	if s.cp.Spec.DisruptionBudget == nil {
		return deleteChild[policyv1.PodDisruptionBudget](ctx, r, s.cp, s.cp.Name)
	}
	_, _, err := ensureChild(ctx, r, s.cp, desiredPodDisruptionBudget(s.cp))
	return err
}

// reconcileRoute creates, updates or deletes the HTTPRoute of spec.route and reads back what the
// gateway controller reported about it.
func (r *CoordinatorPipelineReconciler) reconcileRoute(ctx context.Context, s *scope) error {
	var a *acceptance
	parent, ok := routeParent(s.cp)
	switch {
	case s.cp.Spec.Route == nil:
		if r.routeAPI {
			if err := deleteChild[gatewayv1.HTTPRoute](ctx, r, s.cp, s.cp.Name); err != nil {
				return err
			}
		}
	case !r.routeAPI:
		res := apiUnavailable("HTTPRoute", gatewayv1.GroupVersion.String())
		a = &acceptance{status: metav1.ConditionFalse, reason: res.reason, message: res.message}
	case !ok:
		a = &acceptance{status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonNotAccepted,
			message: "spec.route needs a Gateway to attach to: set spec.route.parentRef or spec.gateway.gatewayRef"}
	default:
		live, _, err := ensureChild(ctx, r, s.cp, desiredHTTPRoute(s.cp))
		if err != nil {
			return err
		}
		accepted := routeAcceptance(live, parent)
		a = &accepted
	}
	s.obs.route = found(a)
	return nil
}

// patchStatus computes the status from the reconcile's findings and patches it when it changed.
// An optimistic-lock conflict is retried without touching the status.
func (r *CoordinatorPipelineReconciler) patchStatus(ctx context.Context, s *scope, reconcileErr error) error {
	if apierrors.IsConflict(reconcileErr) {
		return reconcileErr
	}
	s.obs.err = reconcileErr
	computeStatus(s.cp, s.obs)
	recordOutcome(s.cp)
	r.emitTransitionEvents(s.before, s.cp)
	if equality.Semantic.DeepEqual(s.before.Status, s.cp.Status) {
		return reconcileErr
	}
	if err := r.Status().Patch(ctx, s.cp, client.MergeFrom(s.before)); err != nil && !apierrors.IsNotFound(err) {
		return errors.Join(reconcileErr, fmt.Errorf("patching status: %w", err))
	}
	return reconcileErr
}

// emitTransitionEvents emits Warning events when the pipeline becomes invalid (or its error
// changes), when a tokenizer ConfigMap is missing or an envFrom ConfigMap has a COORDINATOR_* key, when a child conflict appears, when the gateway
// rejects the HTTPRoute, when a Secret or ConfigMap the pods mount for TLS is missing, and when the
// gateway address is refused; steady state emits nothing.
func (r *CoordinatorPipelineReconciler) emitTransitionEvents(before, after *coordinatorv1alpha1.CoordinatorPipeline) {
	for _, w := range []struct {
		condType coordinatorv1alpha1.ConditionType
		reason   coordinatorv1alpha1.ConditionReason
		action   string
	}{
		{coordinatorv1alpha1.ConditionPipelineValid, coordinatorv1alpha1.ReasonInvalidPipeline, "ValidatePipeline"},
		{coordinatorv1alpha1.ConditionPipelineValid, coordinatorv1alpha1.ReasonConfigSchemaUnsupported, "CheckConfigSchema"},
		{coordinatorv1alpha1.ConditionPipelineValid, coordinatorv1alpha1.ReasonTokenizerNotFound, "ReadTokenizer"},
		{coordinatorv1alpha1.ConditionPipelineValid, coordinatorv1alpha1.ReasonEnvFromOverridesConfig, "CheckEnvFrom"},
		{coordinatorv1alpha1.ConditionDegraded, coordinatorv1alpha1.ReasonChildConflict, "ApplyChildren"},
		{coordinatorv1alpha1.ConditionRouteAccepted, coordinatorv1alpha1.ReasonNotAccepted, "AttachRoute"},
		{coordinatorv1alpha1.ConditionRouteAccepted, coordinatorv1alpha1.ReasonRefsNotResolved, "AttachRoute"},
		{coordinatorv1alpha1.ConditionReady, coordinatorv1alpha1.ReasonTLSSecretNotFound, "MountTLSSecret"},
		{coordinatorv1alpha1.ConditionReady, coordinatorv1alpha1.ReasonCABundleNotFound, "MountCABundle"},
		{coordinatorv1alpha1.ConditionGatewayResolved, coordinatorv1alpha1.ReasonAddressNotAllowed, "ResolveGateway"},
	} {
		now := meta.FindStatusCondition(after.Status.Conditions, string(w.condType))
		if now == nil || now.Reason != string(w.reason) {
			continue
		}
		prev := meta.FindStatusCondition(before.Status.Conditions, string(w.condType))
		if prev != nil && prev.Reason == now.Reason && prev.Message == now.Message {
			continue
		}
		r.Recorder.Eventf(after, nil, corev1.EventTypeWarning, string(w.reason), w.action, "%s", now.Message)
	}
}

// gatewayKey is the namespace and name of the Gateway cp references.
func gatewayKey(cp *coordinatorv1alpha1.CoordinatorPipeline) (string, string) {
	return gatewayNamespace(cp), cp.Spec.Gateway.GatewayRef.Name
}

// gatewayNamespace is the namespace of the Gateway cp references (its own by default).
func gatewayNamespace(cp *coordinatorv1alpha1.CoordinatorPipeline) string {
	if ns := cp.Spec.Gateway.GatewayRef.Namespace; ns != "" {
		return ns
	}
	return cp.Namespace
}

// CacheByObject restricts the manager's cache of child kinds to the objects this operator
// manages (LabelManagedBy), instead of every ConfigMap, Service, ServiceAccount, Deployment,
// ReplicaSet, Pod, PodDisruptionBudget, HorizontalPodAutoscaler and NetworkPolicy in the cluster.
func CacheByObject() map[client.Object]cache.ByObject {
	managed := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy})}
	return map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}:      managed,
		&corev1.Service{}:        managed,
		&corev1.ServiceAccount{}: managed,
		&appsv1.Deployment{}:     managed,
		// The coordinator pods and their ReplicaSets (the Deployment's pod template carries the
		// label, and the Deployment controller copies it onto the ReplicaSets), for the rollout
		// status.
		&corev1.Pod{}:        managed,
		&appsv1.ReplicaSet{}: managed,
		// Built-in kinds only: a ByObject entry needs the kind's API installed when the manager
		// starts, so HTTPRoutes (Gateway API, optional) are cached unfiltered.
		&policyv1.PodDisruptionBudget{}:          managed,
		&autoscalingv2.HorizontalPodAutoscaler{}: managed,
		&networkingv1.NetworkPolicy{}:            managed,
	}
}

// CacheOptions are the manager's cache options: only the children the operator manages
// (CacheByObject) and, with a watchNamespace, only that namespace. Every kind the reconciler
// reads or watches is namespaced, so with a watchNamespace the manager needs no cluster-wide
// permission: a Role with the rules of config/rbac/role.yaml in that namespace is enough (the
// Helm chart renders one when watchNamespace is set).
func CacheOptions(watchNamespace string) cache.Options {
	opts := cache.Options{ByObject: CacheByObject()}
	if watchNamespace != "" {
		opts.DefaultNamespaces = map[string]cache.Config{watchNamespace: {}}
	}
	return opts
}

// SetupWithManager registers the reconciler: it owns its children (the HTTPRoute only when its
// API is installed; its status changes bring RouteAccepted up to date), and watches the
// InferencePools and Gateways that pipelines reference (through field indexes), when those APIs
// are installed, and the ConfigMaps of spec.tokenizers and of the unprefixed spec.envFrom (through
// a metadata cache of its own).
func (r *CoordinatorPipelineReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder(ControllerName)
	}
	var err error
	if r.poolAPI, err = hasAPI(mgr, inferencePoolGK, infv1.GroupVersion.Version); err != nil {
		return err
	}
	if r.gatewayAPI, err = hasAPI(mgr, gatewayGK, gatewayv1.GroupVersion.Version); err != nil {
		return err
	}
	if r.routeAPI, err = hasAPI(mgr, httpRouteGK, gatewayv1.GroupVersion.Version); err != nil {
		return err
	}
	log := mgr.GetLogger().WithName(ControllerName)
	if !r.poolAPI {
		log.Info("InferencePool API not installed: pipelines report InferencePoolResolved=False until the operator restarts with it", "group", inferencePoolGK.Group)
	}
	if !r.gatewayAPI {
		log.Info("Gateway API not installed: spec.gateway.gatewayRef cannot resolve until the operator restarts with it", "group", gatewayGK.Group)
	}
	if !r.routeAPI {
		log.Info("Gateway API HTTPRoute not installed: pipelines with spec.route report RouteAccepted=False until the operator restarts with it", "group", httpRouteGK.Group)
	}

	indexer := mgr.GetFieldIndexer()
	if err := indexer.IndexField(ctx, &coordinatorv1alpha1.CoordinatorPipeline{}, indexInferencePool, func(o client.Object) []string {
		return []string{o.(*coordinatorv1alpha1.CoordinatorPipeline).Spec.InferencePoolRef.Name}
	}); err != nil {
		return fmt.Errorf("indexing %s: %w", indexInferencePool, err)
	}
	if err := indexer.IndexField(ctx, &coordinatorv1alpha1.CoordinatorPipeline{}, indexTokenizerConfigMap, tokenizerConfigMapNames); err != nil {
		return fmt.Errorf("indexing %s: %w", indexTokenizerConfigMap, err)
	}
	if err := indexer.IndexField(ctx, &coordinatorv1alpha1.CoordinatorPipeline{}, indexEnvFromConfigMap, envFromConfigMapNames); err != nil {
		return fmt.Errorf("indexing %s: %w", indexEnvFromConfigMap, err)
	}
	if err := indexer.IndexField(ctx, &coordinatorv1alpha1.CoordinatorPipeline{}, indexGateway, func(o client.Object) []string {
		cp := o.(*coordinatorv1alpha1.CoordinatorPipeline)
		if cp.Spec.Gateway.GatewayRef == nil {
			return nil
		}
		ns, name := gatewayKey(cp)
		return []string{ns + "/" + name}
	}); err != nil {
		return fmt.Errorf("indexing %s: %w", indexGateway, err)
	}

	b := ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		// Status writes (ours) do not change the generation: no reconcile for them.
		// Annotations too: the config-schema annotation is read (schema.go) and bumps no generation.
		For(&coordinatorv1alpha1.CoordinatorPipeline{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&corev1.Service{}).
		Owns(&appsv1.Deployment{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Owns(&autoscalingv2.HorizontalPodAutoscaler{}).
		Owns(&networkingv1.NetworkPolicy{})
	// Coordinator pods belong to ReplicaSets, and those to the Deployment, not to the pipeline:
	// map both by their instance label, on the changes the rollout status reads (which pods the
	// ReplicaSets of the Deployment control, listPods).
	b = b.Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(pipelineForInstance), builder.WithPredicates(predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, okOld := e.ObjectOld.(*corev1.Pod)
			cur, okCur := e.ObjectNew.(*corev1.Pod)
			return !okOld || !okCur || podChanged(old, cur)
		},
	}))
	b = b.Watches(&appsv1.ReplicaSet{}, handler.EnqueueRequestsFromMapFunc(pipelineForInstance), builder.WithPredicates(predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool { return controllerChanged(e.ObjectOld, e.ObjectNew) },
	}))
	// The ConfigMaps of spec.tokenizers and of the unprefixed spec.envFrom are the user's, outside
	// the manager's cache: a cache of their metadata alone (identity and version) sees their
	// edits, which re-render tokenizer_revision or add a COORDINATOR_* key, and tells the
	// reconciler when a ConfigMap must be read again.
	configMapCache, err := newReferencedConfigMapCache(mgr, r.WatchNamespace)
	if err != nil {
		return err
	}
	if err := mgr.Add(cacheRunnable{configMapCache}); err != nil {
		return fmt.Errorf("adding the referenced ConfigMap cache: %w", err)
	}
	// The local copies of the tokenizers' files are removed when the manager stops.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		return r.tokenizerCopies.close()
	})); err != nil {
		return fmt.Errorf("adding the tokenizer files cleanup: %w", err)
	}
	r.referencedConfigMaps = configMapCache
	b = b.WatchesRawSource(source.Kind(configMapCache, configMapMetadata(),
		handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, cm *metav1.PartialObjectMetadata) []reconcile.Request {
			return r.pipelinesForConfigMap(ctx, cm)
		})))
	if r.routeAPI {
		b = b.Owns(&gatewayv1.HTTPRoute{})
	}
	if r.poolAPI {
		b = b.Watches(&infv1.InferencePool{}, handler.EnqueueRequestsFromMapFunc(r.pipelinesForPool))
	}
	if r.gatewayAPI {
		b = b.Watches(&gatewayv1.Gateway{}, handler.EnqueueRequestsFromMapFunc(r.pipelinesForGateway))
	}
	return b.Complete(r)
}

// pipelineForInstance maps a coordinator pod or ReplicaSet to its pipeline (LabelInstance, same
// namespace).
func pipelineForInstance(_ context.Context, obj client.Object) []reconcile.Request {
	l := obj.GetLabels()
	if l[LabelName] != AppName || l[LabelInstance] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: obj.GetNamespace(), Name: l[LabelInstance]}}}
}

// controllerChanged is true when an update changes an object's controller reference (a
// ReplicaSet adopted or released by a Deployment): which pods count as the pipeline's.
func controllerChanged(old, cur client.Object) bool {
	a, b := metav1.GetControllerOfNoCopy(old), metav1.GetControllerOfNoCopy(cur)
	return (a == nil) != (b == nil) || (a != nil && a.UID != b.UID)
}

// pipelinesForPool maps an InferencePool to the pipelines of its namespace that reference it.
func (r *CoordinatorPipelineReconciler) pipelinesForPool(ctx context.Context, pool client.Object) []reconcile.Request {
	return r.requestsFor(ctx, client.InNamespace(pool.GetNamespace()), client.MatchingFields{indexInferencePool: pool.GetName()})
}

// pipelinesForConfigMap maps a ConfigMap to the pipelines of its namespace whose spec.tokenizers
// or unprefixed spec.envFrom read it.
func (r *CoordinatorPipelineReconciler) pipelinesForConfigMap(ctx context.Context, cm client.Object) []reconcile.Request {
	in := client.InNamespace(cm.GetNamespace())
	reqs := r.requestsFor(ctx, in, client.MatchingFields{indexTokenizerConfigMap: cm.GetName()})
	for _, req := range r.requestsFor(ctx, in, client.MatchingFields{indexEnvFromConfigMap: cm.GetName()}) {
		if !slices.Contains(reqs, req) {
			reqs = append(reqs, req)
		}
	}
	return reqs
}

// tokenizerConfigMapNames is the indexTokenizerConfigMap of a pipeline: the ConfigMaps of its
// spec.tokenizers.
func tokenizerConfigMapNames(o client.Object) []string {
	var names []string
	for _, t := range o.(*coordinatorv1alpha1.CoordinatorPipeline).Spec.Tokenizers {
		if t.ConfigMap != nil && !slices.Contains(names, t.ConfigMap.Name) {
			names = append(names, t.ConfigMap.Name)
		}
	}
	return names
}

// configMapMetadata is the metadata-only form of a ConfigMap, for the referenced ConfigMap cache.
func configMapMetadata() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
	return m
}

// newReferencedConfigMapCache is the cache of the ConfigMaps pipelines may reference: their
// metadata only, stripped to identity and version (keepIdentity: not their labels, nor
// annotations such as kubectl's last-applied-configuration, which copies the data), of the
// watched namespace or of all. The manager's own cache holds only the ConfigMaps it manages
// (CacheByObject), by label, which the user's ConfigMaps do not carry. Reading them needs no
// permission beyond the operator's: list and watch ConfigMaps.
func newReferencedConfigMapCache(mgr ctrl.Manager, watchNamespace string) (cache.Cache, error) {
	opts := cache.Options{
		Scheme:           mgr.GetScheme(),
		Mapper:           mgr.GetRESTMapper(),
		HTTPClient:       mgr.GetHTTPClient(),
		DefaultTransform: keepIdentity,
	}
	if watchNamespace != "" {
		opts.DefaultNamespaces = map[string]cache.Config{watchNamespace: {}}
	}
	c, err := cache.New(mgr.GetConfig(), opts)
	if err != nil {
		return nil, fmt.Errorf("creating the referenced ConfigMap cache: %w", err)
	}
	return c, nil
}

// cacheRunnable makes the manager start a cache of its own with its caches, before leader
// election and the controllers (a manager runnable with GetCache is started as a cache).
type cacheRunnable struct{ cache.Cache }

// GetCache implements the manager's hasCache.
func (c cacheRunnable) GetCache() cache.Cache { return c.Cache }

// keepIdentity keeps of a metadata-only object its kind, name, namespace, UID, resourceVersion
// and deletion timestamp: all the referenced ConfigMap cache needs.
func keepIdentity(in any) (any, error) {
	m, ok := in.(*metav1.PartialObjectMetadata)
	if !ok {
		return in, nil
	}
	return &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion, DeletionTimestamp: m.DeletionTimestamp,
	}}, nil
}

// pipelinesForGateway maps a Gateway to the pipelines (in any namespace) that reference it.
func (r *CoordinatorPipelineReconciler) pipelinesForGateway(ctx context.Context, gw client.Object) []reconcile.Request {
	return r.requestsFor(ctx, client.MatchingFields{indexGateway: gw.GetNamespace() + "/" + gw.GetName()})
}

func (r *CoordinatorPipelineReconciler) requestsFor(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	var list coordinatorv1alpha1.CoordinatorPipelineList
	if err := r.List(ctx, &list, opts...); err != nil {
		logf.FromContext(ctx).Error(err, "listing CoordinatorPipelines for a watched reference")
		return nil
	}
	reqs := make([]reconcile.Request, len(list.Items))
	for i := range list.Items {
		reqs[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])}
	}
	return reqs
}

// hasAPI reports whether the cluster serves kind gk at version.
func hasAPI(mgr ctrl.Manager, gk schema.GroupKind, version string) (bool, error) {
	_, err := mgr.GetRESTMapper().RESTMapping(gk, version)
	switch {
	case err == nil:
		return true, nil
	case meta.IsNoMatchError(err):
		return false, nil
	default:
		return false, fmt.Errorf("discovering %s: %w", gk, err)
	}
}
