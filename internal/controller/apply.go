package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// applyResult says what ensureChild did.
type applyResult string

const (
	unchanged applyResult = "unchanged"
	created   applyResult = "created"
	updated   applyResult = "updated"
)

// conflictError reports a child that exists but is not controlled by the CoordinatorPipeline.
type conflictError struct {
	kind, name string
}

func (e *conflictError) Error() string {
	return fmt.Sprintf("%s %s exists and is not controlled by this CoordinatorPipeline; delete or rename it", e.kind, e.name)
}

// childKind describes how to compare and overwrite one kind of child.
type childKind[P client.Object] struct {
	// name is the kind, for messages.
	name string
	// inSync reports whether live already carries everything desired sets (fields the API server
	// defaults or other controllers add are ignored).
	inSync func(desired, live P) bool
	// overwrite copies desired's managed content into live.
	overwrite func(desired, live P)
}

var (
	configMapKind = childKind[*corev1.ConfigMap]{
		name: "ConfigMap",
		inSync: func(d, l *corev1.ConfigMap) bool {
			return maps.Equal(d.Data, l.Data) && len(l.BinaryData) == 0
		},
		overwrite: func(d, l *corev1.ConfigMap) { l.Data, l.BinaryData = d.Data, nil },
	}
	serviceAccountKind = childKind[*corev1.ServiceAccount]{
		name: "ServiceAccount",
		inSync: func(d, l *corev1.ServiceAccount) bool {
			return ptr.Equal(d.AutomountServiceAccountToken, l.AutomountServiceAccountToken)
		},
		overwrite: func(d, l *corev1.ServiceAccount) { l.AutomountServiceAccountToken = d.AutomountServiceAccountToken },
	}
	serviceKind = childKind[*corev1.Service]{
		name:   "Service",
		inSync: func(d, l *corev1.Service) bool { return equality.Semantic.DeepDerivative(d.Spec, l.Spec) },
		// Keep what the API server allocated (cluster IPs, IP families).
		overwrite: func(d, l *corev1.Service) {
			l.Spec.Type, l.Spec.Selector, l.Spec.Ports = d.Spec.Type, d.Spec.Selector, d.Spec.Ports
		},
	}
	deploymentKind = childKind[*appsv1.Deployment]{
		name:      "Deployment",
		inSync:    func(d, l *appsv1.Deployment) bool { return equality.Semantic.DeepDerivative(d.Spec, l.Spec) },
		overwrite: func(d, l *appsv1.Deployment) { l.Spec = d.Spec },
	}
	httpRouteKind = childKind[*gatewayv1.HTTPRoute]{
		name:      "HTTPRoute",
		inSync:    func(d, l *gatewayv1.HTTPRoute) bool { return equality.Semantic.DeepDerivative(d.Spec, l.Spec) },
		overwrite: func(d, l *gatewayv1.HTTPRoute) { l.Spec = d.Spec },
	}
	podDisruptionBudgetKind = childKind[*policyv1.PodDisruptionBudget]{
		name:      "PodDisruptionBudget",
		inSync:    func(d, l *policyv1.PodDisruptionBudget) bool { return equality.Semantic.DeepDerivative(d.Spec, l.Spec) },
		overwrite: func(d, l *policyv1.PodDisruptionBudget) { l.Spec = d.Spec },
	}
	networkPolicyKind = childKind[*networkingv1.NetworkPolicy]{
		name:      "NetworkPolicy",
		inSync:    func(d, l *networkingv1.NetworkPolicy) bool { return equality.Semantic.DeepDerivative(d.Spec, l.Spec) },
		overwrite: func(d, l *networkingv1.NetworkPolicy) { l.Spec = d.Spec },
	}
)

// ensureChild makes the child desired exist as the operator wants it, writing only when needed:
// it creates a missing child, and updates an existing one when the desired object changed since
// the operator last wrote it (annotationDesiredHash) or the live object drifted (inSync false).
// A steady child costs one cached read and no write. It returns the live object after the call.
func ensureChild[T any, P interface {
	*T
	client.Object
}](ctx context.Context, r *CoordinatorPipelineReconciler, cp *coordinatorv1alpha1.CoordinatorPipeline, kind childKind[P], desired P) (P, applyResult, error) {
	hash := objectHash(desired)
	desired.SetAnnotations(withEntry(desired.GetAnnotations(), annotationDesiredHash, hash))

	live := P(new(T))
	err := r.Get(ctx, client.ObjectKeyFromObject(desired), live)
	if apierrors.IsNotFound(err) {
		err = r.Create(ctx, desired)
		if err == nil {
			return desired, created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, unchanged, err
		}
		// The cache lags behind a create of ours, or the object is not ours (and not labelled
		// for the cache): ask the API server.
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(desired), live); err != nil {
			return nil, unchanged, err
		}
	} else if err != nil {
		return nil, unchanged, err
	}

	if !metav1.IsControlledBy(live, cp) {
		return nil, unchanged, &conflictError{kind: kind.name, name: desired.GetName()}
	}
	if live.GetDeletionTimestamp() != nil {
		// Being deleted (foreground deletion); its removal brings us back to recreate it.
		return live, unchanged, nil
	}
	// The desired annotations include the hash: equal hashes mean desired has not changed since
	// the last write; inSync catches edits made to the live object since.
	if isSubset(desired.GetAnnotations(), live.GetAnnotations()) &&
		isSubset(desired.GetLabels(), live.GetLabels()) && kind.inSync(desired, live) {
		return live, unchanged, nil
	}

	kind.overwrite(desired, live)
	live.SetLabels(merged(live.GetLabels(), desired.GetLabels()))
	live.SetAnnotations(merged(live.GetAnnotations(), desired.GetAnnotations()))
	if err := r.Update(ctx, live); err != nil {
		return nil, unchanged, err
	}
	return live, updated, nil
}

// getChild reads a child without changing it; nil when it does not exist or is not controlled
// by cp.
func getChild[T any, P interface {
	*T
	client.Object
}](ctx context.Context, r *CoordinatorPipelineReconciler, cp *coordinatorv1alpha1.CoordinatorPipeline, name string) (P, error) {
	live := P(new(T))
	if err := r.Get(ctx, client.ObjectKey{Namespace: cp.Namespace, Name: name}, live); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(live, cp) {
		return nil, nil
	}
	return live, nil
}

// deleteChild deletes the optional child name (an HTTPRoute, PodDisruptionBudget or
// NetworkPolicy the spec no longer asks for) when cp controls it; an object of that name that is
// not cp's is left alone.
func deleteChild[T any, P interface {
	*T
	client.Object
}](ctx context.Context, r *CoordinatorPipelineReconciler, cp *coordinatorv1alpha1.CoordinatorPipeline, name string) error {
	live, err := getChild[T, P](ctx, r, cp, name)
	if err != nil || live == nil || live.GetDeletionTimestamp() != nil {
		return err
	}
	return client.IgnoreNotFound(r.Delete(ctx, live, client.Preconditions{UID: ptr.To(live.GetUID())}))
}

// objectHash fingerprints a desired object (as built, before the hash annotation is added).
func objectHash(obj client.Object) string {
	b, err := json.Marshal(obj)
	if err != nil {
		panic(fmt.Sprintf("objectHash: %v", err)) // API types always marshal
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

func withEntry(m map[string]string, k, v string) map[string]string {
	out := maps.Clone(m)
	if out == nil {
		out = map[string]string{}
	}
	out[k] = v
	return out
}

// merged returns base with over's entries on top (keeps entries other actors added).
func merged(base, over map[string]string) map[string]string {
	out := maps.Clone(base)
	if out == nil {
		out = make(map[string]string, len(over))
	}
	maps.Copy(out, over)
	return out
}

func isSubset(sub, super map[string]string) bool {
	for k, v := range sub {
		if got, ok := super[k]; !ok || got != v {
			return false
		}
	}
	return true
}
