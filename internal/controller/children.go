package controller

import (
	"maps"
	"math"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// Labels and annotations the operator puts on the objects it manages.
const (
	// LabelName, LabelInstance and LabelManagedBy are the recommended app.kubernetes.io labels.
	// Name and instance form the pod selector.
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// AppName is the value of LabelName.
	AppName = "coordinator"
	// ManagedBy is the value of LabelManagedBy; the manager's cache only watches children with it.
	ManagedBy = "coordinator-operator"

	// AnnotationRestartHash on the pod template fingerprints the settings the data plane cannot
	// reload (config.RestartSettings); a change rolls the Deployment.
	AnnotationRestartHash = "coordinator.epd.dev/restart-hash"
	// AnnotationConfigRevision on the ConfigMap is the rendered configuration's revision.
	AnnotationConfigRevision = "coordinator.epd.dev/config-revision"
	// annotationDesiredHash on every child fingerprints the object the operator last wrote, so a
	// change of the desired object is noticed even where it only removes fields.
	annotationDesiredHash = "coordinator.epd.dev/desired-hash"

	// DefaultImage is the coordinator image used when neither spec.image nor the manager's
	// --coordinator-image flag names one.
	DefaultImage = "ghcr.io/epd-dev/coordinator:latest"

	containerName   = "coordinator"
	portName        = "http"
	tlsPortName     = "https"
	metricsPortName = "metrics"
	configVolume    = "config"
	tmpVolume       = "tmp"
	tlsVolume       = "tls"
	gatewayCAVolume = "gateway-ca"
	// tmpSizeLimit caps the /tmp emptyDir (the coordinator writes nothing there; the limit
	// keeps a bug or an exploited dependency from filling the node's disk). Above it the kubelet
	// evicts the pod.
	tmpSizeLimit = "64Mi"
	// secretFileMode makes the mounted TLS files readable by the coordinator's group only
	// (fsGroup nonRootUID).
	secretFileMode int32 = 0o440
	// drainMarginSeconds is added to server.drain_delay and server.shutdown_timeout for
	// terminationGracePeriodSeconds.
	drainMarginSeconds = 5
	nonRootUID         = 65532
)

// configMapName is the name of cp's rendered-configuration ConfigMap.
func configMapName(cp *coordinatorv1alpha1.CoordinatorPipeline) string { return cp.Name + "-config" }

// selectorLabels select cp's coordinator pods.
func selectorLabels(cp *coordinatorv1alpha1.CoordinatorPipeline) map[string]string {
	return map[string]string{LabelName: AppName, LabelInstance: cp.Name}
}

// selectorString is the pod selector in string form (status.selector).
func selectorString(cp *coordinatorv1alpha1.CoordinatorPipeline) string {
	return labels.SelectorFromSet(selectorLabels(cp)).String()
}

// childMeta is the metadata every child shares: name, namespace, labels and the controller
// reference to cp.
func childMeta(cp *coordinatorv1alpha1.CoordinatorPipeline, name string) metav1.ObjectMeta {
	l := selectorLabels(cp)
	l[LabelManagedBy] = ManagedBy
	return metav1.ObjectMeta{
		Name:            name,
		Namespace:       cp.Namespace,
		Labels:          l,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(cp, coordinatorv1alpha1.GroupVersion.WithKind("CoordinatorPipeline"))},
	}
}

// desiredConfigMap holds the rendered configuration under ConfigKey.
func desiredConfigMap(cp *coordinatorv1alpha1.CoordinatorPipeline, rendered string, revision string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{
		ObjectMeta: childMeta(cp, configMapName(cp)),
		Data:       map[string]string{ConfigKey: rendered},
	}
	cm.Annotations = map[string]string{AnnotationConfigRevision: revision}
	return cm
}

// desiredServiceAccount is the coordinator pods' identity. The coordinator never calls the
// Kubernetes API, so no token is mounted.
func desiredServiceAccount(cp *coordinatorv1alpha1.CoordinatorPipeline) *corev1.ServiceAccount {
	return &corev1.ServiceAccount{
		ObjectMeta:                   childMeta(cp, cp.Name),
		AutomountServiceAccountToken: ptr.To(false),
	}
}

// desiredService exposes the coordinator pods on ListenPort, and only there: the metrics and
// admin listener (server.metrics_port) stays off the Service, which the HTTPRoute targets, and is
// scraped on the pods' "metrics" port (a PodMonitor). The port is named and typed https when cfg,
// the applied configuration, serves TLS.
func desiredService(cp *coordinatorv1alpha1.CoordinatorPipeline, cfg *config.Config) *corev1.Service {
	name := servingPortName(cfg)
	return &corev1.Service{
		ObjectMeta: childMeta(cp, cp.Name),
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: selectorLabels(cp),
			Ports: []corev1.ServicePort{{
				Name:        name,
				Protocol:    corev1.ProtocolTCP,
				AppProtocol: ptr.To(name),
				Port:        ListenPort,
				TargetPort:  intstr.FromString(name),
			}},
		},
	}
}

// desiredDeployment runs the coordinator with cfg, the configuration in the ConfigMap (the one
// just rendered, or the last good one while the spec's pipeline is invalid). Only the parts of
// cfg the data plane cannot reload reach the pod template (through AnnotationRestartHash and
// terminationGracePeriodSeconds); pipeline and gateway changes are picked up from the mounted
// file.
func desiredDeployment(cp *coordinatorv1alpha1.CoordinatorPipeline, cfg config.Config, defaultImage string) *appsv1.Deployment {
	spec := &cp.Spec
	image := spec.Image
	if image == "" {
		image = defaultImage
	}
	if image == "" {
		image = DefaultImage
	}
	replicas := ptr.Deref(spec.Replicas, 1)

	// Integer fields the API server defaults are set explicitly (e.g. probes' SuccessThreshold):
	// the drift check treats an unset string, pointer, slice or map as "don't care", but 0 as a
	// value.
	container := corev1.Container{
		Name:            containerName,
		Image:           image,
		ImagePullPolicy: spec.ImagePullPolicy,
		Args:            []string{"--config", ConfigPath},
		Env:             containerEnv(cp, cfg),
		EnvFrom:         containerEnvFrom(cp),
		Ports:           containerPorts(cfg),
		Resources:       *spec.Resources.DeepCopy(),
		LivenessProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString(portName)}},
			PeriodSeconds:    10,
			TimeoutSeconds:   2,
			SuccessThreshold: 1,
			FailureThreshold: 3,
		},
		ReadinessProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString(portName)}},
			PeriodSeconds:    5,
			TimeoutSeconds:   2,
			SuccessThreshold: 1,
			FailureThreshold: 2,
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: configVolume, MountPath: ConfigDir, ReadOnly: true},
			{Name: tmpVolume, MountPath: tmpDir},
		},
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			ReadOnlyRootFilesystem:   ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}

	volumes := []corev1.Volume{
		{Name: configVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: configMapName(cp)},
		}}},
		{Name: tmpVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
			SizeLimit: ptr.To(resource.MustParse(tmpSizeLimit)),
		}}},
	}
	volumes, container.VolumeMounts = addTLSVolumes(cp, cfg, volumes, container.VolumeMounts)
	volumes, container.VolumeMounts = addTokenizerVolumes(cp, volumes, container.VolumeMounts)
	volumes, container.VolumeMounts = addUserVolumes(cp, volumes, container.VolumeMounts)
	if len(spec.Tokenizers) > 0 {
		// The pods are the only ones to read a PersistentVolumeClaim's tokenizer files, and a
		// coordinator that cannot build its pipeline at start exits with the error as its last
		// log line: the kubelet keeps it as the termination message, which the rollout status
		// reports (startFailure). Only with tokenizers, so that upgrading the operator does not
		// roll the coordinators of other pipelines.
		container.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	}
	if secureServing(&cfg) {
		for _, probe := range []*corev1.Probe{container.LivenessProbe, container.ReadinessProbe} {
			probe.HTTPGet.Scheme = corev1.URISchemeHTTPS
			probe.HTTPGet.Port = intstr.FromString(tlsPortName)
		}
	}

	return &appsv1.Deployment{
		ObjectMeta: childMeta(cp, cp.Name),
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: selectorLabels(cp)},
			Strategy: appsv1.DeploymentStrategy{
				Type: appsv1.RollingUpdateDeploymentStrategyType,
				// Never go below the desired number of serving coordinators during a roll.
				RollingUpdate: &appsv1.RollingUpdateDeployment{
					MaxUnavailable: ptr.To(intstr.FromInt32(0)),
					MaxSurge:       ptr.To(intstr.FromString("25%")),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels: podLabels(cp),
					Annotations: podAnnotations(cp, map[string]string{
						AnnotationRestartHash:                     restartHash(cfg),
						"kubectl.kubernetes.io/default-container": containerName,
					}),
				},
				Spec: corev1.PodSpec{
					ServiceAccountName:            serviceAccountName(cp),
					ImagePullSecrets:              imagePullSecrets(cp),
					PriorityClassName:             spec.PriorityClassName,
					AutomountServiceAccountToken:  ptr.To(false),
					EnableServiceLinks:            ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To(terminationGracePeriodSeconds(cfg)),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						RunAsUser:      ptr.To[int64](nonRootUID),
						RunAsGroup:     ptr.To[int64](nonRootUID),
						FSGroup:        ptr.To[int64](nonRootUID),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers:                []corev1.Container{container},
					Volumes:                   volumes,
					NodeSelector:              maps.Clone(spec.NodeSelector),
					Tolerations:               deepCopyTolerations(spec.Tolerations),
					Affinity:                  spec.Affinity.DeepCopy(),
					TopologySpreadConstraints: spreadConstraints(cp),
				},
			},
		},
	}
}

// containerPorts are the API port (named "http", or "https" with TLS) and, when the
// configuration enables it, the metrics and admin port (named "metrics", for a PodMonitor).
func containerPorts(cfg config.Config) []corev1.ContainerPort {
	ports := []corev1.ContainerPort{{Name: servingPortName(&cfg), ContainerPort: ListenPort, Protocol: corev1.ProtocolTCP}}
	if cfg.Server.MetricsPort > 0 {
		ports = append(ports, corev1.ContainerPort{Name: metricsPortName, ContainerPort: int32(cfg.Server.MetricsPort), Protocol: corev1.ProtocolTCP})
	}
	return ports
}

// terminationGracePeriodSeconds leaves the coordinator its whole termination before the kubelet
// kills it: the drain delay (server.drain_delay, during which it still accepts new connections),
// then the drain of in-flight requests and streams (server.shutdown_timeout, the longest one may
// still run), each rounded up to a second, plus a margin for the exit.
func terminationGracePeriodSeconds(cfg config.Config) int64 {
	ceil := func(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }
	return ceil(cfg.Server.Drain()) + ceil(cfg.Server.ShutdownTimeout.Std()) + drainMarginSeconds
}

// spreadConstraints copies the spec's topology spread constraints, giving the ones without a
// labelSelector the coordinator pods' selector.
func spreadConstraints(cp *coordinatorv1alpha1.CoordinatorPipeline) []corev1.TopologySpreadConstraint {
	if len(cp.Spec.TopologySpreadConstraints) == 0 {
		return nil
	}
	out := make([]corev1.TopologySpreadConstraint, len(cp.Spec.TopologySpreadConstraints))
	for i := range cp.Spec.TopologySpreadConstraints {
		cp.Spec.TopologySpreadConstraints[i].DeepCopyInto(&out[i])
		if out[i].LabelSelector == nil {
			out[i].LabelSelector = &metav1.LabelSelector{MatchLabels: selectorLabels(cp)}
		}
	}
	return out
}

func deepCopyTolerations(in []corev1.Toleration) []corev1.Toleration {
	if in == nil {
		return nil
	}
	out := make([]corev1.Toleration, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
}
