package controller

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// result is what one reconcile phase found. The zero value means the phase did not run (an
// earlier one failed): the conditions it feeds keep their previous values.
type result[T any] struct {
	ran   bool
	value T
}

// found is the result of a phase that ran and found v.
func found[T any](v T) result[T] { return result[T]{ran: true, value: v} }

// observed is what one reconcile learned, one result per phase that reports something.
type observed struct {
	// pool and gateway are the resolutions of spec.inferencePoolRef and spec.gateway.
	pool, gateway result[resolution]
	// tls is the resolution of the objects the coordinator pods mount for TLS (the Secret of
	// spec.server.tls, the ConfigMap of spec.gateway.caBundle); ok when none is referenced.
	tls result[resolution]
	// pipeline is the error of validating the spec's pipeline; nil when it is valid.
	pipeline result[error]
	// podCheckedTokenizers, of a valid pipeline, are the tokenizer params whose files only the
	// coordinator pods can read (a PersistentVolumeClaim), with their source.
	podCheckedTokenizers []string
	// applied is the configuration in the ConfigMap: just rendered, or the last good one; nil
	// when there is none.
	applied result[*config.Config]
	// deployment is the coordinator Deployment; nil when there is none (no valid configuration
	// yet).
	deployment result[*appsv1.Deployment]
	// route is the gateway's verdict on the HTTPRoute; nil when spec.route is unset.
	route result[*acceptance]
	// serviceURL is the URL of the coordinator Service.
	serviceURL result[string]
	// pods is what the ready coordinator pods report serving; nil when there is no Deployment.
	pods result[*podSurvey]
	// err is the error that ended the reconcile early, if any.
	err error
}

// computeStatus writes cp.Status from what the reconcile observed. It is pure: the same cp and
// observation give the same status, and unchanged conditions keep their lastTransitionTime.
func computeStatus(cp *coordinatorv1alpha1.CoordinatorPipeline, o observed) {
	cp.Status.ObservedGeneration = cp.Generation
	if o.pipeline.ran {
		setPipelineValidCondition(cp, o.pipeline.value, o.podCheckedTokenizers)
	}
	if o.pool.ran {
		setResolvedCondition(cp, coordinatorv1alpha1.ConditionInferencePoolResolved, o.pool.value)
	}
	if o.gateway.ran {
		setResolvedCondition(cp, coordinatorv1alpha1.ConditionGatewayResolved, o.gateway.value)
	}
	if o.applied.value != nil {
		setConfigStatus(cp, *o.applied.value)
	}
	if o.route.ran {
		setRouteAcceptedCondition(cp, o.route.value)
	}
	if o.serviceURL.ran {
		cp.Status.URL = o.serviceURL.value
	}
	var r *rollout
	if o.deployment.ran {
		ro := rolloutOf(o.deployment.value)
		r = &ro
		setReplicas(cp, o.deployment.value)
		setProgressingCondition(cp, ro)
	}
	if o.pods.ran {
		setRolledOutCondition(cp, revisionRolloutOf(cp, o.pods.value))
		if o.applied.value != nil {
			cp.Status.Revisions = revisionsOf(*o.applied.value, o.pods.value)
		}
	}
	setDegradedCondition(cp, o.err, r)
	setReadyCondition(cp, o.err, o.tls, r)
}

// setCondition sets one condition, stamped with the generation it was computed from.
func setCondition(cp *coordinatorv1alpha1.CoordinatorPipeline, t coordinatorv1alpha1.ConditionType, ok bool, reason coordinatorv1alpha1.ConditionReason, message string) {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&cp.Status.Conditions, metav1.Condition{
		Type:               string(t),
		Status:             status,
		Reason:             string(reason),
		Message:            message,
		ObservedGeneration: cp.Generation,
	})
}

func conditionFalse(cp *coordinatorv1alpha1.CoordinatorPipeline, t coordinatorv1alpha1.ConditionType) *metav1.Condition {
	c := meta.FindStatusCondition(cp.Status.Conditions, string(t))
	if c != nil && c.Status == metav1.ConditionFalse {
		return c
	}
	return nil
}

// setPipelineValidCondition reports the pipeline's validation. The message of an invalid
// pipeline is the data plane's error verbatim, naming the key that failed. The message of a valid
// one names the tokenizer params whose files were not read (podChecked): the pods check them.
func setPipelineValidCondition(cp *coordinatorv1alpha1.CoordinatorPipeline, err error, podChecked []string) {
	switch {
	case imageRefused(err):
		setCondition(cp, coordinatorv1alpha1.ConditionPipelineValid, false, coordinatorv1alpha1.ReasonConfigSchemaUnsupported, err.Error())
		return
	case tokenizerMissing(err):
		setCondition(cp, coordinatorv1alpha1.ConditionPipelineValid, false, coordinatorv1alpha1.ReasonTokenizerNotFound, err.Error())
		return
	case envFromOverrides(err):
		setCondition(cp, coordinatorv1alpha1.ConditionPipelineValid, false, coordinatorv1alpha1.ReasonEnvFromOverridesConfig, err.Error())
		return
	case err != nil:
		setCondition(cp, coordinatorv1alpha1.ConditionPipelineValid, false, coordinatorv1alpha1.ReasonInvalidPipeline, err.Error())
		return
	}
	msg := fmt.Sprintf("all %d steps build with their params", len(cp.Spec.Pipeline.Steps))
	if c := cp.Spec.Canary; c != nil {
		msg += fmt.Sprintf(", and the %d of the canary", len(c.Pipeline.Steps))
	}
	if len(podChecked) > 0 {
		msg += fmt.Sprintf("; the tokenizer files of %s are on a volume the operator does not read: the coordinator pods check them when they load them (a pod that cannot shows in RolledOut)",
			strings.Join(podChecked, ", "))
	}
	setCondition(cp, coordinatorv1alpha1.ConditionPipelineValid, true, coordinatorv1alpha1.ReasonValid, msg)
}

// setResolvedCondition maps a resolution to InferencePoolResolved or GatewayResolved.
func setResolvedCondition(cp *coordinatorv1alpha1.CoordinatorPipeline, t coordinatorv1alpha1.ConditionType, r resolution) {
	setCondition(cp, t, r.ok, r.reason, r.message)
}

// setRouteAcceptedCondition mirrors the gateway's verdict on the HTTPRoute; without spec.route
// (a nil acceptance) the condition is removed.
func setRouteAcceptedCondition(cp *coordinatorv1alpha1.CoordinatorPipeline, a *acceptance) {
	if a == nil {
		meta.RemoveStatusCondition(&cp.Status.Conditions, string(coordinatorv1alpha1.ConditionRouteAccepted))
		return
	}
	meta.SetStatusCondition(&cp.Status.Conditions, metav1.Condition{
		Type:               string(coordinatorv1alpha1.ConditionRouteAccepted),
		Status:             a.status,
		Reason:             string(a.reason),
		Message:            a.message,
		ObservedGeneration: cp.Generation,
	})
}

// setConfigStatus records the applied configuration: its revision (what the coordinators
// report once they load it), steps and gateway address.
func setConfigStatus(cp *coordinatorv1alpha1.CoordinatorPipeline, applied config.Config) {
	cp.Status.ConfigRevision = applied.Revision()
	cp.Status.PipelineSteps = stepSummary(applied)
	cp.Status.GatewayAddress = applied.Gateway.Address
}

// setReplicas copies the Deployment's replica counts and the pod selector (scale subresource),
// and writes readyFraction (ready over desired replicas). updatedReplicas comes from the pods
// (setRolledOutCondition).
func setReplicas(cp *coordinatorv1alpha1.CoordinatorPipeline, dep *appsv1.Deployment) {
	cp.Status.Selector = selectorString(cp)
	if dep == nil {
		cp.Status.Replicas, cp.Status.ReadyReplicas = 0, 0
	} else {
		cp.Status.Replicas = dep.Status.Replicas
		cp.Status.ReadyReplicas = dep.Status.ReadyReplicas
	}
	cp.Status.ReadyFraction = fmt.Sprintf("%d/%d", cp.Status.ReadyReplicas, desiredReplicas(cp))
}

// desiredReplicas is the number of coordinator pods the Deployment asks for.
func desiredReplicas(cp *coordinatorv1alpha1.CoordinatorPipeline) int32 {
	return ptr.Deref(cp.Spec.Replicas, 1)
}

// rollout is the state of the coordinator Deployment's rollout.
type rollout struct {
	// exists is false when there is no Deployment (no valid configuration yet).
	exists bool
	// complete: the Deployment controller has seen the current template, every desired replica
	// runs it and is available, and no old replica is left.
	complete bool
	// stalled: the Deployment reports ProgressDeadlineExceeded.
	stalled bool
	message string
}

// rolloutOf reads a Deployment's rollout state from its status.
func rolloutOf(dep *appsv1.Deployment) rollout {
	if dep == nil {
		return rollout{message: "no coordinator Deployment: no valid configuration has been rendered yet"}
	}
	want := ptr.Deref(dep.Spec.Replicas, 1)
	st := dep.Status
	r := rollout{exists: true}
	for _, c := range st.Conditions {
		if c.Type == appsv1.DeploymentProgressing && c.Status == "False" && c.Reason == "ProgressDeadlineExceeded" {
			r.stalled = true
			r.message = fmt.Sprintf("Deployment %s: %s", dep.Name, c.Message)
			return r
		}
	}
	switch {
	case st.ObservedGeneration < dep.Generation:
		r.message = fmt.Sprintf("Deployment %s: waiting for the Deployment controller to observe generation %d", dep.Name, dep.Generation)
	case st.UpdatedReplicas < want:
		r.message = fmt.Sprintf("Deployment %s: %d of %d replicas updated", dep.Name, st.UpdatedReplicas, want)
	case st.Replicas > st.UpdatedReplicas:
		r.message = fmt.Sprintf("Deployment %s: %d old replicas pending termination", dep.Name, st.Replicas-st.UpdatedReplicas)
	case st.AvailableReplicas < want:
		r.message = fmt.Sprintf("Deployment %s: %d of %d updated replicas available", dep.Name, st.AvailableReplicas, want)
	default:
		r.complete = true
		r.message = fmt.Sprintf("Deployment %s: %d of %d replicas updated and available", dep.Name, st.AvailableReplicas, want)
	}
	return r
}

// setProgressingCondition is True while the Deployment rolls out or scales.
func setProgressingCondition(cp *coordinatorv1alpha1.CoordinatorPipeline, r rollout) {
	switch {
	case !r.exists:
		setCondition(cp, coordinatorv1alpha1.ConditionProgressing, false, coordinatorv1alpha1.ReasonNoValidConfig, r.message)
	case r.stalled:
		setCondition(cp, coordinatorv1alpha1.ConditionProgressing, false, coordinatorv1alpha1.ReasonProgressDeadlineExceeded, r.message)
	case !r.complete:
		setCondition(cp, coordinatorv1alpha1.ConditionProgressing, true, coordinatorv1alpha1.ReasonRollingOut, r.message)
	default:
		setCondition(cp, coordinatorv1alpha1.ConditionProgressing, false, coordinatorv1alpha1.ReasonRolloutComplete, r.message)
	}
}

// setDegradedCondition is True when the spec cannot be applied: the reconcile failed (err), the
// pipeline is invalid, or the rollout stalled (r, nil when the Deployment phase did not run).
func setDegradedCondition(cp *coordinatorv1alpha1.CoordinatorPipeline, err error, r *rollout) {
	var conflict *conflictError
	switch {
	case errors.As(err, &conflict):
		setCondition(cp, coordinatorv1alpha1.ConditionDegraded, true, coordinatorv1alpha1.ReasonChildConflict, conflict.Error())
	case err != nil:
		setCondition(cp, coordinatorv1alpha1.ConditionDegraded, true, coordinatorv1alpha1.ReasonReconcileError, err.Error())
	case conditionFalse(cp, coordinatorv1alpha1.ConditionPipelineValid) != nil:
		reason := coordinatorv1alpha1.ConditionReason(conditionFalse(cp, coordinatorv1alpha1.ConditionPipelineValid).Reason)
		what, until, keep := "spec.pipeline is invalid", "it is fixed", "keep serving configuration revision"
		switch reason {
		case coordinatorv1alpha1.ReasonConfigSchemaUnsupported:
			what, keep = "spec.image cannot read the configuration this operator renders", "keep their image and configuration revision"
		case coordinatorv1alpha1.ReasonTokenizerNotFound:
			what, until, keep = "a ConfigMap of spec.tokenizers does not exist", "it exists", "keep their pod template and configuration revision"
		case coordinatorv1alpha1.ReasonEnvFromOverridesConfig:
			what, until, keep = "an unprefixed ConfigMap of spec.envFrom has a COORDINATOR_* key", "it is gone", "keep their pod template and configuration revision"
		default:
			reason = coordinatorv1alpha1.ReasonInvalidPipeline
		}
		msg := what + " (see PipelineValid); nothing is deployed until " + until
		if cp.Status.ConfigRevision != "" {
			msg = fmt.Sprintf("%s (see PipelineValid); the coordinators %s %s", what, keep, cp.Status.ConfigRevision)
		}
		setCondition(cp, coordinatorv1alpha1.ConditionDegraded, true, reason, msg)
	case r != nil && r.stalled:
		setCondition(cp, coordinatorv1alpha1.ConditionDegraded, true, coordinatorv1alpha1.ReasonProgressDeadlineExceeded, r.message)
	default:
		setCondition(cp, coordinatorv1alpha1.ConditionDegraded, false, coordinatorv1alpha1.ReasonAsExpected, "the spec is applied")
	}
}

// setReadyCondition summarizes: Ready=True only when the reconcile succeeded, the pipeline is
// valid, the gateway and the InferencePool are resolved, the objects the pods mount for TLS exist
// (tls), the gateway accepted the HTTPRoute (with spec.route), and the rollout is complete. The
// reason names the first thing that is not.
func setReadyCondition(cp *coordinatorv1alpha1.CoordinatorPipeline, err error, tls result[resolution], r *rollout) {
	notReady := func(reason coordinatorv1alpha1.ConditionReason, msg string) {
		setCondition(cp, coordinatorv1alpha1.ConditionReady, false, reason, msg)
	}
	var conflict *conflictError
	if errors.As(err, &conflict) {
		notReady(coordinatorv1alpha1.ReasonChildConflict, conflict.Error())
		return
	}
	if err != nil {
		notReady(coordinatorv1alpha1.ReasonReconcileError, err.Error())
		return
	}
	if c := conditionFalse(cp, coordinatorv1alpha1.ConditionPipelineValid); c != nil {
		// InvalidPipeline, ConfigSchemaUnsupported, TokenizerNotFound or EnvFromOverridesConfig.
		notReady(coordinatorv1alpha1.ConditionReason(c.Reason), c.Message)
		return
	}
	if c := conditionFalse(cp, coordinatorv1alpha1.ConditionGatewayResolved); c != nil {
		notReady(coordinatorv1alpha1.ReasonGatewayNotResolved, c.Message)
		return
	}
	if c := conditionFalse(cp, coordinatorv1alpha1.ConditionInferencePoolResolved); c != nil {
		notReady(coordinatorv1alpha1.ReasonInferencePoolNotResolved, c.Message)
		return
	}
	if tls.ran && !tls.value.ok {
		notReady(tls.value.reason, tls.value.message)
		return
	}
	if cp.Spec.Route != nil {
		c := meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionRouteAccepted))
		switch {
		case c == nil:
			notReady(coordinatorv1alpha1.ReasonRouteNotAccepted, "the HTTPRoute has not been reconciled yet")
			return
		case c.Status != metav1.ConditionTrue:
			notReady(coordinatorv1alpha1.ReasonRouteNotAccepted, c.Message)
			return
		}
	}
	switch {
	case r == nil:
		notReady(coordinatorv1alpha1.ReasonDeploymentNotReady, "the coordinator Deployment has not been reconciled yet")
	case !r.exists:
		notReady(coordinatorv1alpha1.ReasonNoValidConfig, r.message)
	case !r.complete:
		notReady(coordinatorv1alpha1.ReasonDeploymentNotReady, r.message)
	default:
		setCondition(cp, coordinatorv1alpha1.ConditionReady, true, coordinatorv1alpha1.ReasonReady,
			fmt.Sprintf("%d coordinator replicas ready; configuration revision %s applied", cp.Status.ReadyReplicas, cp.Status.ConfigRevision))
	}
}

// Bounds of the RolledOut condition's message.
const (
	// rolloutPodsNamed is how many pods a RolledOut message names per kind of problem.
	rolloutPodsNamed = 3
	// rolloutErrorLen bounds one pod's error in the message.
	rolloutErrorLen = 256
)

// Requeue intervals while the pipeline is not rolled out: a coordinator's reload changes no
// object, so nothing else would bring the status up to date.
const (
	// rolloutPollInterval: pods on an older revision (they converge within seconds).
	rolloutPollInterval = 2 * time.Second
	// unknownPollInterval: only pods that could not be asked stand in the way (a NetworkPolicy,
	// a hung pod: rarely gone in seconds, and each pass waits out the probes' timeouts).
	unknownPollInterval = 30 * time.Second
	// rejectedPollInterval: a pod rejected the current revision; it only changes on a new one (a
	// CR update, watched) or when what it rejected for appears (e.g. a CA file).
	rejectedPollInterval = 30 * time.Second
	// maxRevisionLen bounds a revision a pod reports, in messages (ours are 16 hex digits).
	maxRevisionLen = 64
)

// revisionRollout is the RolledOut condition and updatedReplicas, from what the pods reported.
type revisionRollout struct {
	status  metav1.ConditionStatus
	reason  coordinatorv1alpha1.ConditionReason
	message string
	// updated counts the ready pods that serve the current revision with nothing waiting for a
	// restart.
	updated int32
	// requeue is how soon to ask the pods again (0: watches suffice).
	requeue time.Duration
}

// revisionRolloutOf compares what the ready pods of survey report with cp.Status.ConfigRevision.
// A pod that rejected the current revision makes it ConfigRejected; otherwise every desired
// replica must be ready, by the pods and by the Deployment's readyReplicas (which readyFraction
// shows), every ready pod serve the revision and no pod fail to start (RolledOut), else pods on
// other revisions, pods that fail to start or missing replicas make it Progressing, and pods that
// could not be asked Unknown. Pods that fail to start (a coordinator that cannot build its
// pipeline exits) are named in every message but RolledOut's, with their error.
func revisionRolloutOf(cp *coordinatorv1alpha1.CoordinatorPipeline, survey *podSurvey) revisionRollout {
	revision := cp.Status.ConfigRevision
	if survey == nil || revision == "" {
		return revisionRollout{status: metav1.ConditionFalse, reason: coordinatorv1alpha1.ReasonNoValidConfig,
			message: "no coordinator Deployment: no valid configuration has been rendered yet"}
	}
	var updated int32
	var rejected, old, restart, unknown []string
	for _, p := range survey.pods {
		st := p.status
		switch {
		case p.err != "":
			unknown = append(unknown, fmt.Sprintf("%s: %s", p.pod, truncate(p.err, rolloutErrorLen)))
		case st.Revision == revision && st.Reload != nil && len(st.Reload.RestartRequired) > 0:
			restart = append(restart, fmt.Sprintf("%s (waits for a restart for %s)", p.pod, truncate(strings.Join(st.Reload.RestartRequired, ", "), rolloutErrorLen)))
		case st.Revision == revision:
			updated++
		case st.Reload != nil && st.Reload.RejectedRevision == revision:
			schema := ""
			if st.ConfigSchema > 0 {
				schema = fmt.Sprintf(" (its coordinator reads configuration schema %d)", st.ConfigSchema)
			}
			rejected = append(rejected, fmt.Sprintf("%s serves %s: %s%s", p.pod, truncate(st.Revision, maxRevisionLen), truncate(st.Reload.LastError, rolloutErrorLen), schema))
		default:
			old = append(old, fmt.Sprintf("%s serves %s", p.pod, truncate(st.Revision, maxRevisionLen)))
		}
	}
	desired := desiredReplicas(cp)
	ready := int32(len(survey.pods))
	out := revisionRollout{status: metav1.ConditionFalse, updated: updated}
	summary := fmt.Sprintf("%d of %d desired replicas serve revision %s (%d ready)", updated, desired, revision, ready)
	depReady := cp.Status.ReadyReplicas
	if depReady < ready {
		summary = fmt.Sprintf("%d of %d desired replicas serve revision %s (%d ready; the Deployment counts %d)", updated, desired, revision, ready, depReady)
	}
	failing := survey.failing
	switch {
	case len(rejected) > 0:
		out.reason, out.requeue = coordinatorv1alpha1.ReasonConfigRejected, rejectedPollInterval
		out.message = fmt.Sprintf("revision %s rejected by %d of %d ready pods, which keep their last good revision: %s; %s",
			revision, len(rejected), ready, namePods(rejected), summary)
	case updated == ready && updated >= desired && depReady >= desired && len(failing) == 0:
		out.status, out.reason = metav1.ConditionTrue, coordinatorv1alpha1.ReasonRolledOut
		out.message = summary
	case len(old) > 0 || len(restart) > 0 || ready < desired || depReady < desired || len(failing) > 0:
		out.reason = coordinatorv1alpha1.ReasonProgressing
		out.message = summary
		if pending := slices.Concat(old, restart); len(pending) > 0 {
			out.message += "; not yet: " + namePods(pending)
			out.requeue = rolloutPollInterval
		}
		if len(unknown) > 0 {
			out.message += "; not asked: " + namePods(unknown)
			out.requeue = rolloutPollInterval
		}
	default:
		out.status, out.reason, out.requeue = metav1.ConditionUnknown, coordinatorv1alpha1.ReasonRevisionUnknown, unknownPollInterval
		out.message = fmt.Sprintf("%d of %d ready pods could not be asked which revision they serve: %s; %s", len(unknown), ready, namePods(unknown), summary)
	}
	if len(failing) > 0 {
		// Their restarts are watched (podChanged): no requeue for them.
		out.message += "; not starting: " + namePods(failing)
	}
	return out
}

// DefaultCanaryStatusInterval is how often status.revisions is refreshed while a canary runs
// (the manager's --canary-status-interval).
const DefaultCanaryStatusInterval = 30 * time.Second

// revisionsOf is status.revisions: the pipelines of applied (the stable one, and its canary),
// each with the ready pods of survey that report serving its revision on its track and the sums
// of what they report. A pod's report counts once per track (a forged or confused answer that
// lists a track twice adds nothing more), and sums saturate instead of wrapping.
func revisionsOf(applied config.Config, survey *podSurvey) []coordinatorv1alpha1.PipelineRevisionStatus {
	out := []coordinatorv1alpha1.PipelineRevisionStatus{{Track: config.TrackStable, Revision: applied.Pipeline.Revision(), WeightPercent: 100}}
	if c := applied.Canary; c != nil {
		out[0].WeightPercent = int32(100 - c.WeightPercent)
		out = append(out, coordinatorv1alpha1.PipelineRevisionStatus{Track: config.TrackCanary, Revision: c.Pipeline.Revision(), WeightPercent: int32(c.WeightPercent)})
	}
	if survey == nil {
		return out
	}
	for _, p := range survey.pods {
		if p.err != "" {
			continue
		}
		seen := map[string]bool{}
		for _, t := range p.status.Pipelines {
			for i := range out {
				r := &out[i]
				if t.Track != r.Track || t.Revision != r.Revision || seen[t.Track] {
					continue
				}
				seen[t.Track] = true
				r.Pods++
				r.Requests = addSaturating(r.Requests, t.Requests)
				r.Errors = addSaturating(r.Errors, min(t.Errors, t.Requests))
			}
		}
	}
	return out
}

// addSaturating is a+b, at most math.MaxInt64.
func addSaturating(a int64, b uint64) int64 {
	if b > uint64(math.MaxInt64-a) {
		return math.MaxInt64
	}
	return a + int64(b)
}

// setRolledOutCondition writes updatedReplicas and the RolledOut condition.
func setRolledOutCondition(cp *coordinatorv1alpha1.CoordinatorPipeline, r revisionRollout) {
	cp.Status.UpdatedReplicas = r.updated
	meta.SetStatusCondition(&cp.Status.Conditions, metav1.Condition{
		Type:               string(coordinatorv1alpha1.ConditionRolledOut),
		Status:             r.status,
		Reason:             string(r.reason),
		Message:            r.message,
		ObservedGeneration: cp.Generation,
	})
}

// namePods joins the first rolloutPodsNamed entries and counts the rest.
func namePods(entries []string) string {
	if len(entries) <= rolloutPodsNamed {
		return strings.Join(entries, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(entries[:rolloutPodsNamed], "; "), len(entries)-rolloutPodsNamed)
}

// truncate cuts s to at most n bytes (on a rune boundary), marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// serviceURL is the in-cluster URL of cp's coordinator Service: https when cfg, the applied
// configuration, serves TLS.
func serviceURL(cp *coordinatorv1alpha1.CoordinatorPipeline, cfg *config.Config) string {
	scheme := "http"
	if secureServing(cfg) {
		scheme = "https"
	}
	return fmt.Sprintf("%s://%s.%s.svc:%d", scheme, cp.Name, cp.Namespace, ListenPort)
}
