package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// spec.envFrom without a prefix: every key of the source becomes a variable of the coordinator
// container as it is, and a COORDINATOR_* one overrides the configuration the operator renders.
// The CRD refuses the prefixes that could form such a name with a key; the keys of an unprefixed
// ConfigMap are checked here, read like tokenizer ConfigMaps (their version from the metadata
// cache, their data from the API server once per version), and their edits are watched. Secrets
// are not read: the operator never reads a Secret's data, so an unprefixed Secret's keys are the
// user's responsibility.

// indexEnvFromConfigMap maps a ConfigMap to the pipelines of its namespace whose spec.envFrom uses
// it without a prefix.
const indexEnvFromConfigMap = "spec.envFrom.configMapRef.name"

// maxEnvFromChecks bounds the ConfigMap versions whose check is remembered.
const maxEnvFromChecks = 256

// unprefixedConfigMap is the ConfigMap of an envFrom source without a prefix, "" for any other.
func unprefixedConfigMap(e corev1.EnvFromSource) string {
	if e.Prefix != "" || e.ConfigMapRef == nil {
		return ""
	}
	return e.ConfigMapRef.Name
}

// envFromConfigMapNames is the indexEnvFromConfigMap of a pipeline.
func envFromConfigMapNames(o client.Object) []string {
	var names []string
	for _, e := range o.(*coordinatorv1alpha1.CoordinatorPipeline).Spec.EnvFrom {
		if name := unprefixedConfigMap(e); name != "" && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return names
}

// overridingKey is the first key (in order) of cm's data that names a COORDINATOR_* variable, ""
// when none does. binaryData is not turned into variables.
func overridingKey(cm *corev1.ConfigMap) string {
	var keys []string
	for k := range cm.Data {
		if strings.HasPrefix(k, config.EnvPrefix) {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return ""
	}
	return slices.Min(keys)
}

// envFromOverrideError is an unprefixed ConfigMap of spec.envFrom with a COORDINATOR_* key. It is
// reported as PipelineValid=False, reason EnvFromOverridesConfig; the configuration and the
// Deployment are left as they are until the key is gone (the ConfigMap is watched) or the source
// gets a prefix.
type envFromOverrideError struct {
	index          int
	configMap, key string
}

func (e *envFromOverrideError) Error() string {
	return fmt.Sprintf("spec.envFrom[%d].configMapRef: ConfigMap %s has key %s, which without a prefix would override the configuration the operator renders from the spec; "+
		"remove the key or set a prefix; the configuration and the coordinator Deployment are left as they are until then", e.index, e.configMap, e.key)
}

// envFromOverrides reports whether err (the pipeline result) is an envFromOverrideError.
func envFromOverrides(err error) bool {
	var oe *envFromOverrideError
	return errors.As(err, &oe)
}

// envFromOverride checks the unprefixed ConfigMaps of cp's spec.envFrom, in order, and returns the
// first with a COORDINATOR_* key (nil when none has one). A missing ConfigMap has no keys (new pods
// do not start without it, or skip it when it is optional); the error is an API failure.
func (r *CoordinatorPipelineReconciler) envFromOverride(ctx context.Context, cp *coordinatorv1alpha1.CoordinatorPipeline) (*envFromOverrideError, error) {
	for i, e := range cp.Spec.EnvFrom {
		name := unprefixedConfigMap(e)
		if name == "" {
			continue
		}
		key, err := r.envFromOverridingKey(ctx, cp.Namespace, name)
		if err != nil {
			return nil, err
		}
		if key != "" {
			return &envFromOverrideError{index: i, configMap: name, key: key}, nil
		}
	}
	return nil, nil
}

// envFromOverridingKey is overridingKey of ConfigMap namespace/name ("" when it does not exist).
// An unchanged version (from the metadata cache of referenced ConfigMaps) is not read again.
func (r *CoordinatorPipelineReconciler) envFromOverridingKey(ctx context.Context, namespace, name string) (string, error) {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	if r.referencedConfigMaps != nil {
		meta := configMapMetadata()
		switch err := r.referencedConfigMaps.Get(ctx, key, meta); {
		case err == nil:
			if k, ok := r.envFromChecks.lookup(meta.UID, meta.ResourceVersion); ok {
				return k, nil
			}
		case !apierrors.IsNotFound(err):
			return "", fmt.Errorf("reading ConfigMap %s: %w", name, err)
		}
	}
	cm := &corev1.ConfigMap{}
	switch err := r.APIReader.Get(ctx, key, cm); {
	case apierrors.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("reading ConfigMap %s: %w", name, err)
	}
	k := overridingKey(cm)
	r.envFromChecks.add(cm.UID, cm.ResourceVersion, k)
	return k, nil
}

// envFromChecks remembers overridingKey per ConfigMap version (UID and resourceVersion). Its zero
// value is ready to use; beyond maxEnvFromChecks versions it starts over.
type envFromChecks struct {
	mu   sync.Mutex
	keys map[types.UID]string
}

func (c *envFromChecks) lookup(uid types.UID, resourceVersion string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.keys[copyKey(uid, resourceVersion)]
	return k, ok
}

func (c *envFromChecks) add(uid types.UID, resourceVersion, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.keys == nil || len(c.keys) >= maxEnvFromChecks {
		c.keys = map[types.UID]string{}
	}
	c.keys[copyKey(uid, resourceVersion)] = key
}
