package controller

import (
	"maps"
	"net/url"
	pathpkg "path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// The pod settings of the spec (podLabels, podAnnotations, env, envFrom, volumes, volumeMounts)
// are merged with what the operator sets itself. The CRD's CEL rules refuse a spec that would
// override an operator-owned label, annotation, variable, volume or mount; the builders below
// still let the operator's win (dropping the user's entry), so that the Deployment stays valid
// and the coordinator keeps reading the configuration the operator rendered.

// Environment variables the operator may set on the coordinator container.
const (
	// envOTELResourceAttributes carries spec.tracing.resourceAttributes.
	envOTELResourceAttributes = "OTEL_RESOURCE_ATTRIBUTES"
	// envOTELServiceName overrides tracing.service_name in the data plane; refused with
	// spec.tracing.serviceName.
	envOTELServiceName = "OTEL_SERVICE_NAME"
)

// reservedPrefix is the operator's label and annotation domain.
const reservedPrefix = "coordinator.epd.dev/"

// operatorVolumes are the names of the volumes the operator adds to the pod.
var operatorVolumes = []string{configVolume, tmpVolume, tlsVolume, gatewayCAVolume}

// operatorMountDirs are the directories the operator mounts into the coordinator container; a
// user mount may be neither one of them nor below one.
var operatorMountDirs = []string{ConfigDir, TLSDir, GatewayCADir, tmpDir}

// podLabels are spec.podLabels with the operator's labels (the selector and managed-by) on top;
// a podLabels key under coordinator.epd.dev/ is dropped.
func podLabels(cp *coordinatorv1alpha1.CoordinatorPipeline) map[string]string {
	out := make(map[string]string, len(cp.Spec.PodLabels)+3)
	for k, v := range cp.Spec.PodLabels {
		if !strings.HasPrefix(k, reservedPrefix) {
			out[k] = v
		}
	}
	maps.Copy(out, selectorLabels(cp))
	out[LabelManagedBy] = ManagedBy
	return out
}

// podAnnotations are spec.podAnnotations with the operator's annotations (own) on top; a key
// under coordinator.epd.dev/ is dropped.
func podAnnotations(cp *coordinatorv1alpha1.CoordinatorPipeline, own map[string]string) map[string]string {
	out := make(map[string]string, len(cp.Spec.PodAnnotations)+len(own))
	for k, v := range cp.Spec.PodAnnotations {
		if !strings.HasPrefix(k, reservedPrefix) {
			out[k] = v
		}
	}
	maps.Copy(out, own)
	return out
}

// containerEnv is spec.env followed by the variables the operator sets (OTEL_RESOURCE_ATTRIBUTES
// from spec.tracing.resourceAttributes while cfg, the applied configuration, traces). A spec.env
// entry named COORDINATOR_*, like an operator variable, or OTEL_SERVICE_NAME with
// spec.tracing.serviceName is dropped: each would override what the operator rendered. Nil when
// there is none.
func containerEnv(cp *coordinatorv1alpha1.CoordinatorPipeline, cfg config.Config) []corev1.EnvVar {
	var own []corev1.EnvVar
	if t := cp.Spec.Tracing; t != nil && cfg.Tracing.Enabled && len(t.ResourceAttributes) > 0 {
		own = append(own, corev1.EnvVar{Name: envOTELResourceAttributes, Value: resourceAttributes(t.ResourceAttributes)})
	}
	owned := func(name string) bool {
		if t := cp.Spec.Tracing; t != nil && t.ServiceName != "" && name == envOTELServiceName {
			return true // it would override tracing.service_name
		}
		return strings.HasPrefix(name, config.EnvPrefix) || slices.ContainsFunc(own, func(o corev1.EnvVar) bool { return o.Name == name })
	}
	var out []corev1.EnvVar
	for i := range cp.Spec.Env {
		e := &cp.Spec.Env[i]
		if owned(e.Name) {
			continue
		}
		out = append(out, *e.DeepCopy())
	}
	return append(out, own...)
}

// resourceAttributes renders attributes as OTEL_RESOURCE_ATTRIBUTES: name=value pairs sorted by
// name, comma-separated, each value percent-encoded (the OpenTelemetry SDKs decode it), so that
// reordering the list does not roll the pods.
func resourceAttributes(attrs []coordinatorv1alpha1.TracingResourceAttribute) string {
	sorted := slices.Clone(attrs)
	slices.SortFunc(sorted, func(a, b coordinatorv1alpha1.TracingResourceAttribute) int { return strings.Compare(a.Name, b.Name) })
	pairs := make([]string, len(sorted))
	for i, a := range sorted {
		pairs[i] = a.Name + "=" + url.PathEscape(a.Value)
	}
	return strings.Join(pairs, ",")
}

// containerEnvFrom copies spec.envFrom.
func containerEnvFrom(cp *coordinatorv1alpha1.CoordinatorPipeline) []corev1.EnvFromSource {
	if len(cp.Spec.EnvFrom) == 0 {
		return nil
	}
	out := make([]corev1.EnvFromSource, len(cp.Spec.EnvFrom))
	for i := range cp.Spec.EnvFrom {
		cp.Spec.EnvFrom[i].DeepCopyInto(&out[i])
	}
	return out
}

// addUserVolumes appends spec.volumes and spec.volumeMounts to the operator's. A volume named
// like one of the operator's (tokenizer-<name> of spec.tokenizers included) and a hostPath volume
// are dropped, and so is a mount at or under an operator mount (compared cleaned, so
// /etc//coordinator counts: the CRD's rule compares the raw path), the tokenizers' directory
// included when spec.tokenizers is set. A mount of an undeclared volume is kept: the API server
// refuses the Deployment, naming it, and the pipeline reports the error.
func addUserVolumes(cp *coordinatorv1alpha1.CoordinatorPipeline, volumes []corev1.Volume, mounts []corev1.VolumeMount) ([]corev1.Volume, []corev1.VolumeMount) {
	for i := range cp.Spec.Volumes {
		v := &cp.Spec.Volumes[i]
		if slices.Contains(operatorVolumes, v.Name) || v.HostPath != nil || isTokenizerVolume(cp, v.Name) {
			continue
		}
		volumes = append(volumes, *v.DeepCopy())
	}
	for i := range cp.Spec.VolumeMounts {
		m := &cp.Spec.VolumeMounts[i]
		if shadowsOperatorMount(m.MountPath) || shadowsTokenizerMount(cp, m.MountPath) {
			continue
		}
		mounts = append(mounts, *m.DeepCopy())
	}
	return volumes, mounts
}

// shadowsOperatorMount reports whether a mount at path would hide or sit inside one of the
// operator's mounts (path is compared cleaned, as the container runtime resolves it).
func shadowsOperatorMount(path string) bool {
	if !strings.HasPrefix(path, "/") {
		return true
	}
	clean := pathpkg.Clean(path)
	for _, dir := range operatorMountDirs {
		if withinDir(clean, dir) {
			return true
		}
	}
	return false
}

// imagePullSecrets copies spec.imagePullSecrets.
func imagePullSecrets(cp *coordinatorv1alpha1.CoordinatorPipeline) []corev1.LocalObjectReference {
	return slices.Clone(cp.Spec.ImagePullSecrets)
}

// serviceAccountName is spec.serviceAccountName, else the ServiceAccount the operator creates.
func serviceAccountName(cp *coordinatorv1alpha1.CoordinatorPipeline) string {
	if cp.Spec.ServiceAccountName != "" {
		return cp.Spec.ServiceAccountName
	}
	return cp.Name
}
