package controller

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	"go.opentelemetry.io/otel/sdk/resource"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// Every pod setting of the spec lands where it belongs in the Deployment, and the operator's own
// labels, annotations, variables, volumes and mounts win over the spec's.
func TestDesiredDeploymentPodSettings(t *testing.T) {
	secretEnv := corev1.EnvVar{Name: "RENDER_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "render"}, Key: "token",
	}}}
	tokenizer := corev1.Volume{Name: "tokenizer", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: "qwen-tokenizer"},
	}}}
	tokenizerMount := corev1.VolumeMount{Name: "tokenizer", MountPath: "/models/tokenizer", ReadOnly: true}
	container := func(d *appsv1.Deployment) corev1.Container { return d.Spec.Template.Spec.Containers[0] }

	tests := map[string]struct {
		mutate func(*coordinatorv1alpha1.CoordinatorPipeline)
		check  func(g Gomega, d *appsv1.Deployment)
	}{
		"unset: the operator's ServiceAccount, no extra env, volumes or labels": {
			check: func(g Gomega, d *appsv1.Deployment) {
				pod := d.Spec.Template.Spec
				g.Expect(pod.ServiceAccountName).To(Equal("cp"))
				g.Expect(pod.ImagePullSecrets).To(BeNil())
				g.Expect(pod.PriorityClassName).To(BeEmpty())
				g.Expect(container(d).Env).To(BeNil())
				g.Expect(container(d).EnvFrom).To(BeNil())
				g.Expect(pod.Volumes).To(HaveLen(2))
				g.Expect(container(d).VolumeMounts).To(HaveLen(2))
				g.Expect(d.Spec.Template.Labels).To(Equal(map[string]string{LabelName: AppName, LabelInstance: "cp", LabelManagedBy: ManagedBy}))
				g.Expect(d.Spec.Template.Annotations).To(HaveLen(2))
			},
		},
		"every field lands in the pod template": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.PodLabels = map[string]string{"team": "inference", "sidecar.istio.io/inject": "true"}
				cp.Spec.PodAnnotations = map[string]string{"prometheus.io/scrape": "true"}
				cp.Spec.Env = []corev1.EnvVar{{Name: "OTEL_EXPORTER_OTLP_HEADERS", Value: "x-tenant=a"}, secretEnv}
				cp.Spec.EnvFrom = []corev1.EnvFromSource{
					{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}},
					{Prefix: "RENDER_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "render"}}},
				}
				cp.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry"}}
				cp.Spec.PriorityClassName = "inference-critical"
				cp.Spec.ServiceAccountName = "coordinator-workload-identity"
				cp.Spec.Volumes = []corev1.Volume{tokenizer}
				cp.Spec.VolumeMounts = []corev1.VolumeMount{tokenizerMount}
			},
			check: func(g Gomega, d *appsv1.Deployment) {
				tpl := d.Spec.Template
				g.Expect(tpl.Labels).To(Equal(map[string]string{
					LabelName: AppName, LabelInstance: "cp", LabelManagedBy: ManagedBy,
					"team": "inference", "sidecar.istio.io/inject": "true",
				}))
				g.Expect(tpl.Annotations).To(HaveKeyWithValue("prometheus.io/scrape", "true"))
				g.Expect(tpl.Annotations).To(HaveKey(AnnotationRestartHash))
				g.Expect(d.Spec.Selector.MatchLabels).To(Equal(selectorLabels(newPipeline("ns", "cp"))), "the selector is not widened")
				g.Expect(d.Labels).NotTo(HaveKey("team"), "podLabels label the pods only")
				pod := tpl.Spec
				g.Expect(pod.ServiceAccountName).To(Equal("coordinator-workload-identity"))
				g.Expect(pod.AutomountServiceAccountToken).To(Equal(ptr.To(false)), "still no token")
				g.Expect(pod.ImagePullSecrets).To(Equal([]corev1.LocalObjectReference{{Name: "registry"}}))
				g.Expect(pod.PriorityClassName).To(Equal("inference-critical"))
				g.Expect(pod.Volumes).To(HaveLen(3))
				g.Expect(pod.Volumes[2]).To(Equal(tokenizer))
				c := container(d)
				g.Expect(c.Env).To(Equal([]corev1.EnvVar{{Name: "OTEL_EXPORTER_OTLP_HEADERS", Value: "x-tenant=a"}, secretEnv}))
				g.Expect(c.EnvFrom).To(HaveLen(2))
				g.Expect(c.EnvFrom[0].SecretRef.Name).To(Equal("creds"))
				g.Expect(c.EnvFrom[1].Prefix).To(Equal("RENDER_"))
				g.Expect(c.VolumeMounts).To(HaveLen(3))
				g.Expect(c.VolumeMounts[2]).To(Equal(tokenizerMount))
				g.Expect(c.VolumeMounts[0]).To(Equal(corev1.VolumeMount{Name: "config", MountPath: "/etc/coordinator", ReadOnly: true}))
			},
		},
		"user volumes follow the TLS and CA volumes": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "tls"}
				cp.Spec.Volumes = []corev1.Volume{tokenizer}
				cp.Spec.VolumeMounts = []corev1.VolumeMount{tokenizerMount}
			},
			check: func(g Gomega, d *appsv1.Deployment) {
				names := []string{}
				for _, v := range d.Spec.Template.Spec.Volumes {
					names = append(names, v.Name)
				}
				g.Expect(names).To(Equal([]string{"config", "tmp", "tls", "tokenizer"}))
				g.Expect(container(d).VolumeMounts[3]).To(Equal(tokenizerMount))
			},
		},
		"operator labels and annotations win": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.PodLabels = map[string]string{
					LabelName: "x", LabelInstance: "y", LabelManagedBy: "helm", "coordinator.epd.dev/revision": "1", "keep": "me",
				}
				cp.Spec.PodAnnotations = map[string]string{
					AnnotationRestartHash: "0", "coordinator.epd.dev/other": "x", "kubectl.kubernetes.io/default-container": "sidecar", "keep": "me",
				}
			},
			check: func(g Gomega, d *appsv1.Deployment) {
				tpl := d.Spec.Template
				g.Expect(tpl.Labels).To(Equal(map[string]string{LabelName: AppName, LabelInstance: "cp", LabelManagedBy: ManagedBy, "keep": "me"}))
				base := deploymentFor(t, newPipeline("ns", "cp"), "")
				g.Expect(tpl.Annotations).To(Equal(map[string]string{
					AnnotationRestartHash:                     base.Spec.Template.Annotations[AnnotationRestartHash],
					"kubectl.kubernetes.io/default-container": "coordinator",
					"keep": "me",
				}))
			},
		},
		"COORDINATOR_* variables and the operator's OTEL_* variables are dropped from env": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{ServiceName: "c", ResourceAttributes: []coordinatorv1alpha1.TracingResourceAttribute{{Name: "a", Value: "1"}}}
				cp.Spec.Env = []corev1.EnvVar{
					{Name: "COORDINATOR_SERVER_LISTEN_ADDR", Value: ":1"},
					{Name: "OTEL_RESOURCE_ATTRIBUTES", Value: "a=2"},
					{Name: "OTEL_SERVICE_NAME", Value: "d"},
					{Name: "KEEP", Value: "me"},
				}
			},
			check: func(g Gomega, d *appsv1.Deployment) {
				g.Expect(container(d).Env).To(Equal([]corev1.EnvVar{{Name: "KEEP", Value: "me"}, {Name: "OTEL_RESOURCE_ATTRIBUTES", Value: "a=1"}}))
			},
		},
		"operator volumes and mounts win; hostPath volumes are dropped": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Volumes = []corev1.Volume{
					{Name: "config", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					{Name: "node", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}},
					tokenizer,
				}
				cp.Spec.VolumeMounts = []corev1.VolumeMount{
					{Name: "tokenizer", MountPath: "/etc/coordinator"},
					{Name: "tokenizer", MountPath: "/etc/coordinator/sub"},
					{Name: "tokenizer", MountPath: "/etc//coordinator-tls/"},
					{Name: "tokenizer", MountPath: "/srv/../tmp"},
					{Name: "tokenizer", MountPath: "relative"},
					{Name: "config", MountPath: "/srv/config"},
					{Name: "node", MountPath: "/host"},
					{Name: "missing", MountPath: "/srv/missing"},
					{Name: "tokenizer", MountPath: "/etc/coordinator-extra"},
					{Name: "tmp", MountPath: "/srv/scratch"},
				}
			},
			check: func(g Gomega, d *appsv1.Deployment) {
				pod := d.Spec.Template.Spec
				g.Expect(pod.Volumes).To(HaveLen(3))
				g.Expect(pod.Volumes[0].ConfigMap).NotTo(BeNil(), "the operator's config volume")
				g.Expect(pod.Volumes[2]).To(Equal(tokenizer))
				// Mounts of a missing or an operator volume are left for the API server to judge.
				g.Expect(container(d).VolumeMounts).To(Equal([]corev1.VolumeMount{
					{Name: "config", MountPath: "/etc/coordinator", ReadOnly: true},
					{Name: "tmp", MountPath: "/tmp"},
					{Name: "config", MountPath: "/srv/config"},
					{Name: "node", MountPath: "/host"},
					{Name: "missing", MountPath: "/srv/missing"},
					{Name: "tokenizer", MountPath: "/etc/coordinator-extra"},
					{Name: "tmp", MountPath: "/srv/scratch"},
				}))
			},
		},
		"tracing resource attributes: sorted, percent-encoded": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{ResourceAttributes: []coordinatorv1alpha1.TracingResourceAttribute{
					{Name: "k8s.cluster.name", Value: "prod eu,1"},
					{Name: "deployment.environment.name", Value: "a=b%/ü"},
				}}
			},
			check: func(g Gomega, d *appsv1.Deployment) {
				g.Expect(container(d).Env).To(Equal([]corev1.EnvVar{{
					Name: "OTEL_RESOURCE_ATTRIBUTES", Value: "deployment.environment.name=a=b%25%2F%C3%BC,k8s.cluster.name=prod%20eu%2C1",
				}}))
			},
		},
		"tracing disabled: no resource attributes": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{Enabled: ptr.To(false),
					ResourceAttributes: []coordinatorv1alpha1.TracingResourceAttribute{{Name: "a", Value: "1"}}}
			},
			check: func(g Gomega, d *appsv1.Deployment) { g.Expect(container(d).Env).To(BeNil()) },
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline("ns", "cp")
			if tc.mutate != nil {
				tc.mutate(cp)
			}
			before := cp.DeepCopy()
			d := deploymentFor(t, cp, "")
			tc.check(g, d)
			g.Expect(cp).To(Equal(before), "the builder must not modify the CoordinatorPipeline")
		})
	}
}

// The OpenTelemetry SDK reads back what resourceAttributes renders.
func TestResourceAttributesDecode(t *testing.T) {
	g := NewWithT(t)
	attrs := []coordinatorv1alpha1.TracingResourceAttribute{{Name: "b", Value: "x, y=z%"}, {Name: "a", Value: ""}}
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", resourceAttributes(attrs))
	res, err := resource.New(context.Background(), resource.WithFromEnv())
	g.Expect(err).NotTo(HaveOccurred())
	got := map[string]string{}
	for _, kv := range res.Attributes() {
		got[string(kv.Key)] = kv.Value.AsString()
	}
	g.Expect(got).To(Equal(map[string]string{"a": "", "b": "x, y=z%"}))
}
