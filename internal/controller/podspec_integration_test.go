package controller

import (
	"context"
	"fmt"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// The API server refuses pod settings that would override what the operator owns (selector
// labels, its annotations, COORDINATOR_* variables, its volumes and mount paths), naming the
// field, and bounds the lists and strings.
func TestPodSettingsValidationRejects(t *testing.T) {
	e := envSuite(t)
	ns := e.namespace(t)
	emptyDir := func(name string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	}
	mountAt := func(path string) func(*coordinatorv1alpha1.CoordinatorPipeline) {
		return func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Volumes = []corev1.Volume{emptyDir("data")}
			cp.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: path}}
		}
	}
	// prefixed sets one envFrom ConfigMap source with prefix p.
	prefixed := func(p string) func(*coordinatorv1alpha1.CoordinatorPipeline) {
		return func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.EnvFrom = []corev1.EnvFromSource{{Prefix: p, ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}}
		}
	}
	envFromMsg := func(i int, p string) string {
		return fmt.Sprintf(`spec.envFrom: Invalid value: spec.envFrom[%d].prefix %q could form COORDINATOR_ names with the keys of its source: they would override the configuration the operator renders from the spec`, i, p)
	}
	const startsMsg = `spec.envFrom: Invalid value: spec.envFrom[0].prefix starts with COORDINATOR_: its variables would override the configuration the operator renders from the spec`
	const (
		labelsMsg      = `spec.podLabels: Invalid value: podLabels must not set app.kubernetes.io/name, app.kubernetes.io/instance, app.kubernetes.io/managed-by or a coordinator.epd.dev/ key: the operator owns them (name and instance select the coordinator pods)`
		annotationsMsg = `spec.podAnnotations: Invalid value: podAnnotations must not set a coordinator.epd.dev/ key or kubectl.kubernetes.io/default-container: the operator owns them`
		volumeNameMsg  = `spec.volumes: Invalid value: volume names config, tmp, tls and gateway-ca are the operator's: choose another name`
		shadowMsg      = `spec.volumeMounts: Invalid value: volumeMounts must not mount at or under /etc/coordinator, /etc/coordinator-tls, /etc/coordinator-gateway-ca or /tmp: the operator mounts the configuration, TLS files and scratch space there`
		relativeMsg    = `spec.volumeMounts: Invalid value: volumeMounts mountPath must be an absolute path`
	)
	tests := map[string]struct {
		mutate  func(*coordinatorv1alpha1.CoordinatorPipeline)
		wantErr string
	}{
		"podLabels set the selector's instance": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.PodLabels = map[string]string{LabelInstance: "other"}
			},
			wantErr: labelsMsg,
		},
		"podLabels set the selector's name": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.PodLabels = map[string]string{LabelName: "x"}
			},
			wantErr: labelsMsg,
		},
		"podLabels set managed-by": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.PodLabels = map[string]string{LabelManagedBy: "helm"}
			},
			wantErr: labelsMsg,
		},
		"podLabels in the operator's domain": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.PodLabels = map[string]string{"coordinator.epd.dev/revision": "1"}
			},
			wantErr: labelsMsg,
		},
		"too many podLabels": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.PodLabels = map[string]string{}
				for i := range 33 {
					cp.Spec.PodLabels[fmt.Sprintf("l%d", i)] = "v"
				}
			},
			wantErr: `spec.podLabels: Too many: 33: must have at most 32 items`,
		},
		"podAnnotations set the restart hash": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.PodAnnotations = map[string]string{AnnotationRestartHash: "0"}
			},
			wantErr: annotationsMsg,
		},
		"podAnnotations set the default container": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.PodAnnotations = map[string]string{"kubectl.kubernetes.io/default-container": "sidecar"}
			},
			wantErr: annotationsMsg,
		},
		"env overrides the rendered configuration": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Env = []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "COORDINATOR_SERVER_LISTEN_ADDR", Value: ":9"}}
			},
			wantErr: `spec.env: Invalid value: env must not set COORDINATOR_* variables: they override the configuration the operator renders from the spec; set the matching spec field instead`,
		},
		// A prefix that is COORDINATOR_, starts with it, or is a start of it (COORD + a key
		// INATOR_SERVER_...) forms COORDINATOR_* names with the source's keys.
		"envFrom prefix COORDINATOR_":  {mutate: prefixed("COORDINATOR_"), wantErr: startsMsg},
		"envFrom prefix COORDINATOR_X": {mutate: prefixed("COORDINATOR_X"), wantErr: startsMsg},
		"envFrom prefix COORDINATOR":   {mutate: prefixed("COORDINATOR"), wantErr: envFromMsg(0, "COORDINATOR")},
		"envFrom prefix COORD":         {mutate: prefixed("COORD"), wantErr: envFromMsg(0, "COORD")},
		"envFrom prefix C":             {mutate: prefixed("C"), wantErr: envFromMsg(0, "C")},
		"envFrom prefix COORD of a Secret, second entry": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.EnvFrom = []corev1.EnvFromSource{
					{Prefix: "APP_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}},
					{Prefix: "COORD", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}},
				}
			},
			wantErr: envFromMsg(1, "COORD"),
		},
		"env sets OTEL_RESOURCE_ATTRIBUTES next to tracing.resourceAttributes": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Env = []corev1.EnvVar{{Name: "OTEL_RESOURCE_ATTRIBUTES", Value: "a=1"}}
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{ResourceAttributes: []coordinatorv1alpha1.TracingResourceAttribute{{Name: "b", Value: "2"}}}
			},
			wantErr: `spec.env: Invalid value: env must not set OTEL_RESOURCE_ATTRIBUTES when tracing.resourceAttributes is set: the operator renders it from them`,
		},
		"env sets OTEL_SERVICE_NAME next to tracing.serviceName": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Env = []corev1.EnvVar{{Name: "OTEL_SERVICE_NAME", Value: "x"}}
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{ServiceName: "y"}
			},
			wantErr: `spec.env: Invalid value: env must not set OTEL_SERVICE_NAME when tracing.serviceName is set: it would override it`,
		},
		"env names a variable twice": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Env = []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "A", Value: "2"}}
			},
			wantErr: `spec.env[1]: Duplicate value: {"name":"A"}`,
		},
		"too many env": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				for i := range 65 {
					cp.Spec.Env = append(cp.Spec.Env, corev1.EnvVar{Name: fmt.Sprintf("V%d", i)})
				}
			},
			wantErr: `spec.env: Too many: 65: must have at most 64 items`,
		},
		"too many envFrom": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				for range 17 {
					cp.Spec.EnvFrom = append(cp.Spec.EnvFrom, corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}})
				}
			},
			wantErr: `spec.envFrom: Too many: 17: must have at most 16 items`,
		},
		"too many imagePullSecrets": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				for range 17 {
					cp.Spec.ImagePullSecrets = append(cp.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: "r"})
				}
			},
			wantErr: `spec.imagePullSecrets: Too many: 17: must have at most 16 items`,
		},
		"volume named config": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Volumes = []corev1.Volume{emptyDir("config")}
			},
			wantErr: volumeNameMsg,
		},
		"volume named tls": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Volumes = []corev1.Volume{emptyDir("tls")} },
			wantErr: volumeNameMsg,
		},
		"volume named gateway-ca": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Volumes = []corev1.Volume{emptyDir("gateway-ca")}
			},
			wantErr: volumeNameMsg,
		},
		"volume named tmp": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Volumes = []corev1.Volume{emptyDir("tmp")} },
			wantErr: volumeNameMsg,
		},
		"hostPath volume": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Volumes = []corev1.Volume{{Name: "node", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
			},
			wantErr: `spec.volumes: Invalid value: hostPath volumes are not allowed: the coordinator pods run under the restricted Pod Security profile`,
		},
		"volume named twice": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Volumes = []corev1.Volume{emptyDir("a"), emptyDir("a")}
			},
			wantErr: `spec.volumes[1]: Duplicate value: {"name":"a"}`,
		},
		"too many volumes": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				for i := range 17 {
					cp.Spec.Volumes = append(cp.Spec.Volumes, emptyDir(fmt.Sprintf("v%d", i)))
				}
			},
			wantErr: `spec.volumes: Too many: 17: must have at most 16 items`,
		},
		"mount over the configuration":   {mutate: mountAt("/etc/coordinator"), wantErr: shadowMsg},
		"mount inside the configuration": {mutate: mountAt("/etc/coordinator/tokenizer"), wantErr: shadowMsg},
		"mount over the TLS directory":   {mutate: mountAt("/etc/coordinator-tls"), wantErr: shadowMsg},
		"mount over the gateway CA":      {mutate: mountAt("/etc/coordinator-gateway-ca/"), wantErr: shadowMsg},
		"mount over /tmp":                {mutate: mountAt("/tmp"), wantErr: shadowMsg},
		"relative mount path":            {mutate: mountAt("etc/coordinator"), wantErr: relativeMsg},
		"two mounts at one path": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Volumes = []corev1.Volume{emptyDir("a"), emptyDir("b")}
				cp.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "a", MountPath: "/a"}, {Name: "b", MountPath: "/a"}}
			},
			wantErr: `spec.volumeMounts[1]: Duplicate value: {"mountPath":"/a"}`,
		},
		"priorityClassName is not a DNS subdomain": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.PriorityClassName = "High_Priority" },
			wantErr: `spec.priorityClassName: Invalid value: "High_Priority": spec.priorityClassName in body should match`,
		},
		"serviceAccountName is not a DNS subdomain": {
			mutate:  func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.ServiceAccountName = "my sa" },
			wantErr: `spec.serviceAccountName: Invalid value: "my sa": spec.serviceAccountName in body should match`,
		},
		"tracing endpoint is not a URL": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{Endpoint: "otel-collector:4318"}
			},
			wantErr: `spec.tracing.endpoint: Invalid value: "otel-collector:4318": endpoint must be an http:// or https:// URL with a host, e.g. http://otel-collector:4318`,
		},
		"tracing samples more than all": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{SamplingRatePerMillion: ptr.To[int32](1000001)}
			},
			wantErr: `spec.tracing.samplingRatePerMillion: Invalid value: 1000001: spec.tracing.samplingRatePerMillion in body should be less than or equal to 1000000`,
		},
		"tracing resource attribute service.name": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{ResourceAttributes: []coordinatorv1alpha1.TracingResourceAttribute{{Name: "service.name", Value: "x"}}}
			},
			wantErr: `spec.tracing.resourceAttributes: Invalid value: resourceAttributes must not set service.name: set tracing.serviceName`,
		},
		"tracing resource attribute name with a comma": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{ResourceAttributes: []coordinatorv1alpha1.TracingResourceAttribute{{Name: "a,b", Value: "x"}}}
			},
			wantErr: `spec.tracing.resourceAttributes[0].name: Invalid value: "a,b": spec.tracing.resourceAttributes[0].name in body should match`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline(ns, "pod")
			cp.UID, cp.Generation = "", 0
			tc.mutate(cp)
			err := e.client.Create(context.Background(), cp, client.DryRunAll)
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(ContainSubstring(tc.wantErr))
		})
	}
}

// Pod settings the rules do not refuse are accepted, including names and paths next to the
// operator's.
func TestPodSettingsAccepted(t *testing.T) {
	e := envSuite(t)
	ns := e.namespace(t)
	tests := map[string]func(*coordinatorv1alpha1.CoordinatorPipeline){
		"every pod setting": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.PodLabels = map[string]string{"app.kubernetes.io/part-of": "llm-d", "team": "inference"}
			cp.Spec.PodAnnotations = map[string]string{"sidecar.istio.io/inject": "false", "kubectl.kubernetes.io/restartedAt": "now"}
			cp.Spec.Env = []corev1.EnvVar{
				{Name: "OTEL_EXPORTER_OTLP_HEADERS", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "otel"}, Key: "headers"}}},
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "OTEL_SERVICE_NAME", Value: "allowed without tracing.serviceName"},
			}
			cp.Spec.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}}
			cp.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
			cp.Spec.PriorityClassName = "system-cluster-critical"
			cp.Spec.ServiceAccountName = "coordinator.identity"
			cp.Spec.Volumes = []corev1.Volume{
				{Name: "tokenizer", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "tok"}}}},
				{Name: "config-extra", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "certs"}}},
			}
			cp.Spec.VolumeMounts = []corev1.VolumeMount{
				{Name: "tokenizer", MountPath: "/models/tokenizer", ReadOnly: true},
				{Name: "config-extra", MountPath: "/etc/coordinator-extra"},
				{Name: "config-extra", MountPath: "/etc/render-ca", SubPath: "ca.crt"},
			}
			cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{
				Endpoint: "https://otel-collector.monitoring.svc:4318", SamplingRatePerMillion: ptr.To[int32](1000000),
				ResourceAttributes: []coordinatorv1alpha1.TracingResourceAttribute{{Name: "k8s.cluster.name", Value: "eu, prod"}},
			}
		},
		"the limits": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.PodLabels, cp.Spec.PodAnnotations = map[string]string{}, map[string]string{}
			for i := range 32 {
				cp.Spec.PodLabels[fmt.Sprintf("l%d", i)] = "v"
				cp.Spec.PodAnnotations[fmt.Sprintf("a%d", i)] = "v"
			}
			for i := range 64 {
				cp.Spec.Env = append(cp.Spec.Env, corev1.EnvVar{Name: fmt.Sprintf("V%d", i)})
			}
			for i := range 16 {
				name := fmt.Sprintf("v%d", i)
				cp.Spec.Volumes = append(cp.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
				cp.Spec.VolumeMounts = append(cp.Spec.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: "/data/" + name})
			}
		},
		// Prefixes that cannot form a COORDINATOR_* name (names are case-sensitive), and sources
		// without a prefix, whose keys the operator checks (ConfigMaps) or leaves to the user
		// (Secrets).
		"envFrom prefixes that form no COORDINATOR_ name": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			for _, p := range []string{"CO_", "APP_", "coord", "Coordinator_", "XCOORDINATOR_", "COORDINATE_"} {
				cp.Spec.EnvFrom = append(cp.Spec.EnvFrom, corev1.EnvFromSource{Prefix: p, ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}})
			}
		},
		"envFrom without a prefix": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.EnvFrom = []corev1.EnvFromSource{
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}},
				{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}},
			}
		},
		"an empty tracing section": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{}
		},
		"OTEL_RESOURCE_ATTRIBUTES without tracing.resourceAttributes": func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Env = []corev1.EnvVar{{Name: "OTEL_RESOURCE_ATTRIBUTES", Value: "a=1"}}
			cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{ServiceName: "c"}
		},
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline(ns, "pod")
			cp.UID, cp.Generation = "", 0
			mutate(cp)
			g.Expect(e.client.Create(context.Background(), cp, client.DryRunAll)).To(Succeed())
		})
	}

	t.Run("tracing.enabled defaults to true", func(t *testing.T) {
		g := NewWithT(t)
		cp := newPipeline(ns, "tracing-default")
		cp.UID, cp.Generation = "", 0
		cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{}
		g.Expect(e.client.Create(context.Background(), cp, client.DryRunAll)).To(Succeed())
		g.Expect(cp.Spec.Tracing.Enabled).To(Equal(ptr.To(true)))
	})
}

// Env from a Secret and an extra volume reach the Deployment, and the API server accepts the
// pod template built from them; changing them rolls the Deployment, a pipeline change after that
// does not.
func TestPodSettingsReachTheDeployment(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	ctx := context.Background()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "render-token"},
		StringData: map[string]string{"token": "s3cret", "ca.crt": "-----BEGIN CERTIFICATE-----"},
	}
	g.Expect(e.client.Create(ctx, secret)).To(Succeed())

	tokenEnv := corev1.EnvVar{Name: "RENDER_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "render-token"}, Key: "token",
	}}}
	e.readyPipeline(t, g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Env = []corev1.EnvVar{tokenEnv}
		cp.Spec.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "render-token"}}}}
		cp.Spec.Volumes = []corev1.Volume{{Name: "render-ca", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: "render-token", Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
		}}}}
		cp.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "render-ca", MountPath: "/etc/render-ca", ReadOnly: true}}
		cp.Spec.PodLabels = map[string]string{"team": "inference"}
		cp.Spec.PodAnnotations = map[string]string{"example.com/note": "x"}
		cp.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
		cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{Endpoint: "http://otel-collector:4318",
			ResourceAttributes: []coordinatorv1alpha1.TracingResourceAttribute{{Name: "k8s.cluster.name", Value: "test"}}}
	})
	dep := e.children(g, ns, "epd").dep
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	g.Expect(c.Env).To(HaveLen(2))
	g.Expect(c.Env[0].Name).To(Equal("RENDER_TOKEN"))
	g.Expect(c.Env[0].ValueFrom.SecretKeyRef.Name).To(Equal("render-token"))
	g.Expect(c.Env[0].ValueFrom.SecretKeyRef.Key).To(Equal("token"))
	g.Expect(c.Env[1]).To(Equal(corev1.EnvVar{Name: "OTEL_RESOURCE_ATTRIBUTES", Value: "k8s.cluster.name=test"}))
	g.Expect(c.EnvFrom).To(HaveLen(1))
	g.Expect(c.EnvFrom[0].SecretRef.Name).To(Equal("render-token"))
	g.Expect(pod.Volumes).To(ContainElement(And(HaveField("Name", "render-ca"), HaveField("VolumeSource.Secret.SecretName", "render-token"))))
	g.Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "render-ca", MountPath: "/etc/render-ca", ReadOnly: true}))
	g.Expect(dep.Spec.Template.Labels).To(HaveKeyWithValue("team", "inference"))
	g.Expect(dep.Spec.Template.Annotations).To(HaveKeyWithValue("example.com/note", "x"))
	g.Expect(pod.ImagePullSecrets).To(Equal([]corev1.LocalObjectReference{{Name: "registry"}}))
	cm := e.children(g, ns, "epd").cm
	rendered, err := parseConfig(cm.Data[ConfigKey])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rendered.Tracing.Enabled).To(BeTrue())
	g.Expect(rendered.Tracing.Endpoint).To(Equal("http://otel-collector:4318"))

	// Another variable rolls the Deployment.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Env = append(cp.Spec.Env, corev1.EnvVar{Name: "EXTRA", Value: "1"})
	})
	var rolled *appsv1.Deployment
	g.Eventually(func(g Gomega) {
		rolled = e.children(g, ns, "epd").dep
		g.Expect(rolled.Spec.Template.Spec.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: "EXTRA", Value: "1"}))
	}).Should(Succeed())
	g.Expect(rolled.Generation).To(BeNumerically(">", dep.Generation))
	e.markDeploymentAvailable(g, ns, "epd")
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})
	rolled = e.children(g, ns, "epd").dep

	// A pipeline change with the pod settings in place still hot-reloads.
	before := e.children(g, ns, "epd")
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Pipeline.Steps = cp.Spec.Pipeline.Steps[1:]
	})
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		g.Expect(cp.Status.PipelineSteps).To(Equal("prefill,decode"))
	})
	after := e.children(g, ns, "epd")
	g.Expect(after.cm.ResourceVersion).NotTo(Equal(before.cm.ResourceVersion))
	g.Expect(after.dep.Generation).To(Equal(rolled.Generation), "a pipeline-only change must not roll the Deployment")
	g.Expect(after.dep.Spec.Template).To(Equal(rolled.Spec.Template))
}

// A mount of a volume the spec does not declare passes the CRD (a CEL rule comparing the two
// lists would exceed the API server's cost budget); the API server refuses the Deployment, and
// the pipeline reports its message.
func TestMountOfAnUndeclaredVolumeIsReported(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "tokenizer", MountPath: "/models/tokenizer"}}
	})
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReconcileError)
		// The index is the container's: the operator's own mounts come first.
		g.Expect(c.Message).To(ContainSubstring(`spec.template.spec.containers[0].volumeMounts[2].name: Not found: "tokenizer"`))
	})
}

// An unprefixed envFrom ConfigMap is checked for COORDINATOR_* keys, and watched: a key added to
// it later refuses the pipeline (PipelineValid, Ready and Degraded, reason EnvFromOverridesConfig,
// with a Warning event) and leaves the Deployment as it is; a prefix on the source applies it
// again. An unprefixed Secret's keys are not read: they are the user's responsibility.
func TestEnvFromConfigMapKeysAreChecked(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	ctx := context.Background()
	g.Expect(e.client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "creds"},
		StringData: map[string]string{"COORDINATOR_LOG_LEVEL": "3"}})).To(Succeed())
	settings := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "settings"}, Data: map[string]string{"APP_MODE": "fast"}}
	g.Expect(e.client.Create(ctx, settings)).To(Succeed())
	e.readyPipeline(t, g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.EnvFrom = []corev1.EnvFromSource{secretEnv("creds", ""), configMapEnv("settings", "")}
	})
	before := e.children(g, ns, "epd")

	// COORD + INATOR_... cannot be split across prefix and key; the key whole is refused.
	settings.Data["COORDINATOR_SERVER_LISTEN_ADDR"] = ":1"
	g.Expect(e.client.Update(ctx, settings)).To(Succeed())
	const want = "spec.envFrom[1].configMapRef: ConfigMap settings has key COORDINATOR_SERVER_LISTEN_ADDR, which without a prefix would override the configuration " +
		"the operator renders from the spec; remove the key or set a prefix; the configuration and the coordinator Deployment are left as they are until then"
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonEnvFromOverridesConfig)
		g.Expect(c.Message).To(Equal(want))
	})
	g.Expect(expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonEnvFromOverridesConfig).Message).To(Equal(want))
	g.Expect(expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionTrue, coordinatorv1alpha1.ReasonEnvFromOverridesConfig).Message).To(
		Equal("an unprefixed ConfigMap of spec.envFrom has a COORDINATOR_* key (see PipelineValid); the coordinators keep their pod template and configuration revision " + cp.Status.ConfigRevision))
	g.Eventually(func(g Gomega) {
		var events eventsv1.EventList
		g.Expect(e.client.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
		g.Expect(events.Items).To(ContainElement(And(
			HaveField("Type", corev1.EventTypeWarning), HaveField("Reason", "EnvFromOverridesConfig"), HaveField("Note", want))))
	}).Should(Succeed())

	// A spec change while refused changes nothing.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Env = []corev1.EnvVar{{Name: "EXTRA", Value: "1"}}
	})
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonEnvFromOverridesConfig)
	})
	held := e.children(g, ns, "epd")
	g.Expect(held.dep.Generation).To(Equal(before.dep.Generation), "the Deployment is left as it is")

	// With a prefix the ConfigMap's keys cannot override the configuration: applied.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.EnvFrom[1].Prefix = "APP_"
	})
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		g.Expect(e.children(g, ns, "epd").dep.Spec.Template.Spec.Containers[0].EnvFrom).To(Equal(
			[]corev1.EnvFromSource{secretEnv("creds", ""), configMapEnv("settings", "APP_")}))
	})
}
