package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/csaupgrade"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

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

// FieldOwner is the field manager the operator applies its children as (server-side apply).
const FieldOwner = "coordinator-operator"

// legacyFieldManager is the field manager the operator's updates were recorded under before it
// applied server-side: the API server names a client that sets none after its user agent's
// program. ensureChild hands that manager's fields to FieldOwner, so a field the operator no
// longer sets is removed by its next apply instead of staying owned by the old name.
var legacyFieldManager = strings.SplitN(rest.DefaultKubernetesUserAgent(), "/", 2)[0]

// ensureChild makes the child desired exist as the operator wants it, by server-side apply as
// FieldOwner: fields other actors own (a cluster IP, kubectl rollout restart's annotation, a
// label another controller adds) are kept. It writes only when needed: when the child is
// missing, when the desired object changed since the operator last applied it
// (annotationDesiredHash), or when the live object drifted from it (inSync false). A steady child
// costs one cached read and no write. It returns the live object after the call.
func ensureChild[T any, P interface {
	*T
	client.Object
}](ctx context.Context, r *CoordinatorPipelineReconciler, cp *coordinatorv1alpha1.CoordinatorPipeline, desired P) (P, applyResult, error) {
	hash := objectHash(desired)
	desired.SetAnnotations(withEntry(desired.GetAnnotations(), annotationDesiredHash, hash))

	live := P(new(T))
	err := r.Get(ctx, client.ObjectKeyFromObject(desired), live)
	switch {
	case apierrors.IsNotFound(err):
		// The cache may lag behind a create of ours, or the object is not ours (and not
		// labelled for the cache): ask the API server before applying over it.
		if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(desired), live); apierrors.IsNotFound(err) {
			applied, err := apply(ctx, r, desired)
			return applied, created, err
		} else if err != nil {
			return nil, unchanged, err
		}
	case err != nil:
		return nil, unchanged, err
	}

	if !metav1.IsControlledBy(live, cp) {
		return nil, unchanged, &conflictError{kind: kindName(desired), name: desired.GetName()}
	}
	if live.GetDeletionTimestamp() != nil {
		// Being deleted (foreground deletion); its removal brings us back to recreate it.
		return live, unchanged, nil
	}
	// The desired annotations include the hash: equal hashes mean desired has not changed since
	// the last apply; inSync catches edits made to the live object since.
	if isSubset(desired.GetAnnotations(), live.GetAnnotations()) &&
		isSubset(desired.GetLabels(), live.GetLabels()) && inSync(desired, live) {
		return live, unchanged, nil
	}
	if err := adoptLegacyFields(ctx, r, live); err != nil {
		return nil, unchanged, err
	}
	applied, err := apply(ctx, r, desired)
	return applied, updated, err
}

// apply server-side applies desired as FieldOwner, taking over fields another manager set
// (the operator is the child's controller), and returns the object the API server answered.
func apply[T any, P interface {
	*T
	client.Object
}](ctx context.Context, r *CoordinatorPipelineReconciler, desired P) (P, error) {
	content, err := runtime.DefaultUnstructuredConverter.ToUnstructured(desired)
	if err != nil {
		return nil, err
	}
	// Neither the status nor the null creation timestamps a typed object carries are the
	// operator's to declare.
	delete(content, "status")
	unstructured.RemoveNestedField(content, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(content, "spec", "template", "metadata", "creationTimestamp")
	gvk, err := apiutil.GVKForObject(desired, r.Scheme())
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: content}
	u.SetGroupVersionKind(gvk)
	if err := r.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return nil, err
	}
	live := P(new(T))
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, live); err != nil {
		return nil, err
	}
	return live, nil
}

// adoptLegacyFields moves the fields live's legacyFieldManager owns through updates to
// FieldOwner's apply, with a JSON patch guarded by live's resourceVersion (a conflict is
// retried by the reconcile). It runs once per child: a child FieldOwner has applied was made
// or adopted by this operator already, and a later client that shares the legacy name (every
// kubebuilder binary is called manager) keeps its fields.
func adoptLegacyFields(ctx context.Context, r *CoordinatorPipelineReconciler, live client.Object) error {
	for _, m := range live.GetManagedFields() {
		if m.Manager == FieldOwner && m.Operation == metav1.ManagedFieldsOperationApply {
			return nil
		}
	}
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(live, sets.New(legacyFieldManager), FieldOwner)
	if err != nil || patch == nil {
		return err
	}
	return r.Patch(ctx, live, client.RawPatch(types.JSONPatchType, patch))
}

// inSync reports whether live carries everything desired sets outside its metadata and status:
// fields the API server defaults or other actors add are ignored, an edit of a field the
// operator sets is not.
func inSync(desired, live client.Object) bool {
	d, l := reflect.ValueOf(desired).Elem(), reflect.ValueOf(live).Elem()
	for i := range d.NumField() {
		switch d.Type().Field(i).Name {
		case "TypeMeta", "ObjectMeta", "Status":
			continue
		}
		if !equality.Semantic.DeepDerivative(d.Field(i).Interface(), l.Field(i).Interface()) {
			return false
		}
	}
	return true
}

// kindName is obj's kind, for messages.
func kindName(obj client.Object) string {
	return reflect.TypeOf(obj).Elem().Name()
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

func isSubset(sub, super map[string]string) bool {
	for k, v := range sub {
		if got, ok := super[k]; !ok || got != v {
			return false
		}
	}
	return true
}
