package controller

import (
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// deploymentFor renders cp and builds its Deployment.
func deploymentFor(t *testing.T, cp *coordinatorv1alpha1.CoordinatorPipeline, defaultImage string) *appsv1.Deployment {
	t.Helper()
	cfg, err := renderConfig(cp, testGateway)
	if err != nil {
		t.Fatal(err)
	}
	return desiredDeployment(cp, cfg, defaultImage)
}

func expectOwnedBy(g Gomega, obj metav1.Object, cp *coordinatorv1alpha1.CoordinatorPipeline) {
	g.Expect(obj.GetOwnerReferences()).To(HaveLen(1))
	ref := obj.GetOwnerReferences()[0]
	g.Expect(ref.APIVersion).To(Equal("coordinator.epd.dev/v1alpha1"))
	g.Expect(ref.Kind).To(Equal("CoordinatorPipeline"))
	g.Expect(ref.Name).To(Equal(cp.Name))
	g.Expect(ref.UID).To(Equal(cp.UID))
	g.Expect(ref.Controller).To(Equal(ptr.To(true)))
	g.Expect(ref.BlockOwnerDeletion).To(Equal(ptr.To(true)))
	g.Expect(obj.GetNamespace()).To(Equal(cp.Namespace))
	g.Expect(obj.GetLabels()).To(HaveKeyWithValue(LabelManagedBy, ManagedBy))
}

func TestDesiredDeployment(t *testing.T) {
	tests := map[string]struct {
		mutate       func(*coordinatorv1alpha1.CoordinatorPipeline)
		defaultImage string
		check        func(g Gomega, d *appsv1.Deployment)
	}{
		"shape: owner, selector, config mount, args, port, probes": {
			check: func(g Gomega, d *appsv1.Deployment) {
				g.Expect(d.Name).To(Equal("cp"))
				g.Expect(d.Spec.Replicas).To(Equal(ptr.To[int32](1)))
				g.Expect(d.Spec.Selector.MatchLabels).To(Equal(map[string]string{LabelName: AppName, LabelInstance: "cp"}))
				g.Expect(d.Spec.Template.Labels).To(HaveKeyWithValue(LabelInstance, "cp"))
				g.Expect(d.Spec.Strategy.RollingUpdate.MaxUnavailable).To(Equal(ptr.To(intstr.FromInt32(0))))
				pod := d.Spec.Template.Spec
				g.Expect(pod.ServiceAccountName).To(Equal("cp"))
				g.Expect(pod.AutomountServiceAccountToken).To(Equal(ptr.To(false)))
				g.Expect(pod.Volumes).To(ContainElement(HaveField("VolumeSource.ConfigMap.Name", "cp-config")))
				c := pod.Containers[0]
				g.Expect(c.Image).To(Equal(DefaultImage))
				g.Expect(c.Args).To(Equal([]string{"--config", "/etc/coordinator/coordinator.yaml"}))
				g.Expect(c.Ports).To(Equal([]corev1.ContainerPort{
					{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
					{Name: "metrics", ContainerPort: config.DefaultMetricsPort, Protocol: corev1.ProtocolTCP},
				}))
				g.Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "config", MountPath: "/etc/coordinator", ReadOnly: true}))
				g.Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
				g.Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
				g.Expect(c.ReadinessProbe.HTTPGet.Port).To(Equal(intstr.FromString("http")))
			},
		},
		"plain HTTP: no TLS volumes, HTTP probes, a size-limited /tmp": {
			check: func(g Gomega, d *appsv1.Deployment) {
				pod := d.Spec.Template.Spec
				g.Expect(pod.Volumes).To(HaveLen(2))
				g.Expect(pod.Volumes[1]).To(Equal(corev1.Volume{Name: "tmp", VolumeSource: corev1.VolumeSource{
					EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("64Mi"))},
				}}))
				c := pod.Containers[0]
				g.Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "tmp", MountPath: "/tmp"}))
				g.Expect(c.LivenessProbe.HTTPGet.Scheme).To(BeEmpty())
				g.Expect(c.ReadinessProbe.HTTPGet.Scheme).To(BeEmpty())
			},
		},
		"TLS: the Secret mounted read-only, HTTPS probes and port": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "coordinator-tls"}
			},
			check: func(g Gomega, d *appsv1.Deployment) {
				pod := d.Spec.Template.Spec
				g.Expect(pod.Volumes).To(ContainElement(corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
					SecretName:  "coordinator-tls",
					Items:       []corev1.KeyToPath{{Key: "tls.crt", Path: "tls.crt"}, {Key: "tls.key", Path: "tls.key"}},
					DefaultMode: ptr.To[int32](0o440),
					Optional:    ptr.To(false),
				}}}))
				g.Expect(pod.SecurityContext.FSGroup).To(Equal(ptr.To[int64](65532)), "the group that may read tls.key")
				c := pod.Containers[0]
				g.Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "tls", MountPath: "/etc/coordinator-tls", ReadOnly: true}))
				g.Expect(c.Ports[0]).To(Equal(corev1.ContainerPort{Name: "https", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}))
				for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
					g.Expect(p.HTTPGet.Scheme).To(Equal(corev1.URISchemeHTTPS))
					g.Expect(p.HTTPGet.Port).To(Equal(intstr.FromString("https")))
				}
				// The Secret's content is not fingerprinted: kubelet refreshes the mount and the
				// coordinator reloads the certificate, so a rotation does not roll the pods.
				g.Expect(d.Spec.Template.Annotations).To(HaveLen(2))
			},
		},
		"gateway CA bundle: the ConfigMap key mounted as ca.crt": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway.Address = "https://gw.infra.svc"
				cp.Spec.Gateway.CABundle = &coordinatorv1alpha1.CABundleReference{ConfigMapName: "trust", Key: "bundle.pem"}
			},
			check: func(g Gomega, d *appsv1.Deployment) {
				pod := d.Spec.Template.Spec
				g.Expect(pod.Volumes).To(ContainElement(corev1.Volume{Name: "gateway-ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "trust"},
					Items:                []corev1.KeyToPath{{Key: "bundle.pem", Path: "ca.crt"}},
					Optional:             ptr.To(false),
				}}}))
				g.Expect(pod.Containers[0].VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "gateway-ca", MountPath: "/etc/coordinator-gateway-ca", ReadOnly: true}))
				g.Expect(pod.Containers[0].ReadinessProbe.HTTPGet.Scheme).To(BeEmpty(), "the API itself stays plain HTTP")
			},
		},
		"restricted pod security": {
			check: func(g Gomega, d *appsv1.Deployment) {
				pod := d.Spec.Template.Spec
				g.Expect(pod.SecurityContext.RunAsNonRoot).To(Equal(ptr.To(true)))
				g.Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
				sc := pod.Containers[0].SecurityContext
				g.Expect(sc.RunAsNonRoot).To(Equal(ptr.To(true)))
				g.Expect(sc.ReadOnlyRootFilesystem).To(Equal(ptr.To(true)))
				g.Expect(sc.AllowPrivilegeEscalation).To(Equal(ptr.To(false)))
				g.Expect(sc.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}))
				g.Expect(sc.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
			},
		},
		"termination grace covers the default drain delay and shutdown timeout": {
			check: func(g Gomega, d *appsv1.Deployment) {
				g.Expect(d.Spec.Template.Spec.TerminationGracePeriodSeconds).To(Equal(ptr.To[int64](5 + 25 + 5)))
				g.Expect(d.Spec.Template.Spec.Containers[0].Lifecycle).To(BeNil(), "the coordinator drains itself: no preStop")
			},
		},
		"termination grace follows shutdownTimeout, rounded up": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Server.ShutdownTimeout = duration("90.5s") },
			check: func(g Gomega, d *appsv1.Deployment) {
				g.Expect(d.Spec.Template.Spec.TerminationGracePeriodSeconds).To(Equal(ptr.To[int64](5 + 91 + 5)))
			},
		},
		"termination grace follows drainDelay, rounded up": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Server.DrainDelay, cp.Spec.Server.ShutdownTimeout = duration("12.2s"), duration("1m")
			},
			check: func(g Gomega, d *appsv1.Deployment) {
				g.Expect(d.Spec.Template.Spec.TerminationGracePeriodSeconds).To(Equal(ptr.To[int64](13 + 60 + 5)))
			},
		},
		"no drain delay": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Server.DrainDelay = duration("0s") },
			check: func(g Gomega, d *appsv1.Deployment) {
				g.Expect(d.Spec.Template.Spec.TerminationGracePeriodSeconds).To(Equal(ptr.To[int64](0 + 25 + 5)))
			},
		},
		"operator default image": {
			defaultImage: "registry.local/coordinator:v9",
			check: func(g Gomega, d *appsv1.Deployment) {
				g.Expect(d.Spec.Template.Spec.Containers[0].Image).To(Equal("registry.local/coordinator:v9"))
			},
		},
		"pod settings pass through": {
			defaultImage: "registry.local/coordinator:v9",
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Replicas = ptr.To[int32](3)
				cp.Spec.Image = "example.com/c:1"
				cp.Spec.ImagePullPolicy = corev1.PullAlways
				cp.Spec.Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}
				cp.Spec.NodeSelector = map[string]string{"pool": "cpu"}
				cp.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
				cp.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{}}
				cp.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{
					{MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.ScheduleAnyway},
					{MaxSkew: 2, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"x": "y"}}},
				}
			},
			check: func(g Gomega, d *appsv1.Deployment) {
				g.Expect(d.Spec.Replicas).To(Equal(ptr.To[int32](3)))
				pod := d.Spec.Template.Spec
				c := pod.Containers[0]
				g.Expect(c.Image).To(Equal("example.com/c:1"))
				g.Expect(c.ImagePullPolicy).To(Equal(corev1.PullAlways))
				g.Expect(c.Resources.Requests.Cpu().String()).To(Equal("500m"))
				g.Expect(pod.NodeSelector).To(Equal(map[string]string{"pool": "cpu"}))
				g.Expect(pod.Tolerations).To(HaveLen(1))
				g.Expect(pod.Affinity.PodAntiAffinity).NotTo(BeNil())
				g.Expect(pod.TopologySpreadConstraints[0].LabelSelector.MatchLabels).To(Equal(map[string]string{LabelName: AppName, LabelInstance: "cp"}))
				g.Expect(pod.TopologySpreadConstraints[1].LabelSelector.MatchLabels).To(Equal(map[string]string{"x": "y"}))
			},
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
			d := deploymentFor(t, cp, tc.defaultImage)
			expectOwnedBy(g, d, cp)
			tc.check(g, d)
			g.Expect(cp).To(Equal(before), "the builder must not modify the CoordinatorPipeline")
		})
	}
}

// A change the coordinators hot-reload from the ConfigMap must leave the pod template equal;
// anything the data plane cannot reload, and every pod setting, must change it.
func TestPodTemplateChangesOnlyForRestartSettings(t *testing.T) {
	tests := map[string]struct {
		mutate   func(*coordinatorv1alpha1.CoordinatorPipeline)
		wantRoll bool
	}{
		"steps": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Pipeline.Steps = cp.Spec.Pipeline.Steps[1:] }},
		"step params": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Pipeline.Steps[1].Params = params(map[string]any{"kv_connector": "kv-nixl"})
		}},
		"connectors": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Pipeline.ECConnector = "ec-nixl" }},
		"gateway":    {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Gateway.IdleConnTimeout = duration("1s") }},
		"gateway read bounds": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway.IdleTimeout, cp.Spec.Gateway.RequestTimeout = duration("0s"), duration("1h")
			cp.Spec.Gateway.MaxResponseSizeMiB = ptr.To[int32](64)
		}},
		"gateway retries": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway.Retry = &coordinatorv1alpha1.GatewayRetrySpec{
				MaxAttempts: ptr.To[int32](1), InitialBackoff: duration("1ms"), MaxBackoff: duration("1ms"),
				MaxRetryAfter: duration("0s"), BudgetPercent: ptr.To[int32](0), BudgetMinPerSecond: ptr.To[int32](0),
			}
		}},
		"pool failure policy": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Pipeline.OnPoolFailure = coordinatorv1alpha1.PoolFailureFail
		}},
		"pool reference": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.InferencePoolRef.Name = "other" }},
		// The data plane reloads these too.
		"log level": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.LogLevel = 5 }},
		"body limit": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Server.MaxRequestBodySizeMiB = ptr.To[int32](2)
		}},
		// It cannot apply new listener timeouts.
		"read timeout":  {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Server.ReadTimeout = duration("1h") }, wantRoll: true},
		"write timeout": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Server.WriteTimeout = duration("1h") }, wantRoll: true},
		// terminationGracePeriodSeconds follows the drain timeout.
		"shutdown timeout": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Server.ShutdownTimeout = duration("1m") }, wantRoll: true},
		"drain delay":      {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Server.DrainDelay = duration("10s") }, wantRoll: true},
		// The default, spelled out: the same pod template.
		"drain delay at its default": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Server.DrainDelay = duration("5s") }},
		// The scale subresource's field: more pods of the same template.
		"replicas": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Replicas = ptr.To[int32](3) }},
		// TLS: new listeners, and new volumes to mount.
		"TLS": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "tls"}
		}, wantRoll: true},
		"gateway CA bundle": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway.Address = "https://gw"
			cp.Spec.Gateway.CABundle = &coordinatorv1alpha1.CABundleReference{ConfigMapName: "ca"}
		}, wantRoll: true},
		// Pod settings.
		"image": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Image = "example.com/c:2" }, wantRoll: true},
		"resources": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}
		}, wantRoll: true},
		"pod labels": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.PodLabels = map[string]string{"team": "a"}
		}, wantRoll: true},
		"pod annotations": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.PodAnnotations = map[string]string{"a": "b"}
		}, wantRoll: true},
		"env": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Env = []corev1.EnvVar{{Name: "A", Value: "b"}}
		}, wantRoll: true},
		"envFrom": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}}}
		}, wantRoll: true},
		"image pull secrets": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "r"}}
		}, wantRoll: true},
		"priority class":  {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.PriorityClassName = "high" }, wantRoll: true},
		"service account": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.ServiceAccountName = "sa" }, wantRoll: true},
		"volumes and mounts": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
			cp.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "v", MountPath: "/v"}}
		}, wantRoll: true},
		// The coordinator sets up its tracer provider at start.
		"tracing": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{Endpoint: "http://otel:4318"}
		}, wantRoll: true},
		"tracing sampling": {mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Tracing = &coordinatorv1alpha1.TracingSpec{Enabled: ptr.To(false), SamplingRatePerMillion: ptr.To[int32](1)}
		}, wantRoll: true},
	}
	base := deploymentFor(t, newPipeline("ns", "cp"), "")
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			d := deploymentFor(t, newPipeline("ns", "cp", tc.mutate), "")
			if tc.wantRoll {
				g.Expect(d.Spec.Template).NotTo(Equal(base.Spec.Template))
				return
			}
			g.Expect(d.Spec.Template).To(Equal(base.Spec.Template))
		})
	}
}

func TestDesiredConfigMapServiceServiceAccount(t *testing.T) {
	cp := newPipeline("ns", "cp")
	tests := map[string]struct {
		obj   metav1.Object
		check func(g Gomega)
	}{
		"configmap holds coordinator.yaml and the revision": {
			obj: desiredConfigMap(cp, "log_level: 2\n", "abc123"),
			check: func(g Gomega) {
				cm := desiredConfigMap(cp, "log_level: 2\n", "abc123")
				g.Expect(cm.Name).To(Equal("cp-config"))
				g.Expect(cm.Data).To(Equal(map[string]string{"coordinator.yaml": "log_level: 2\n"}))
				g.Expect(cm.Annotations).To(HaveKeyWithValue(AnnotationConfigRevision, "abc123"))
			},
		},
		"service exposes 8080 to the coordinator pods": {
			obj: desiredService(cp, nil),
			check: func(g Gomega) {
				svc := desiredService(cp, nil)
				g.Expect(svc.Name).To(Equal("cp"))
				g.Expect(svc.Spec.Selector).To(Equal(selectorLabels(cp)))
				// The API port only: the metrics and admin port (/metrics, /debug/pipeline) stays
				// off the Service the HTTPRoute targets.
				g.Expect(svc.Spec.Ports).To(Equal([]corev1.ServicePort{{
					Name: "http", Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To("http"), Port: 8080, TargetPort: intstr.FromString("http"),
				}}))
			},
		},
		"with TLS the service port is https": {
			obj: desiredService(cp, tlsConfig()),
			check: func(g Gomega) {
				svc := desiredService(cp, tlsConfig())
				g.Expect(svc.Spec.Ports).To(Equal([]corev1.ServicePort{{
					Name: "https", Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To("https"), Port: 8080, TargetPort: intstr.FromString("https"),
				}}))
			},
		},
		"service account mounts no token": {
			obj: desiredServiceAccount(cp),
			check: func(g Gomega) {
				g.Expect(desiredServiceAccount(cp).AutomountServiceAccountToken).To(Equal(ptr.To(false)))
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			expectOwnedBy(g, tc.obj, cp)
			tc.check(g)
		})
	}
}

// tlsConfig is an applied configuration serving TLS.
func tlsConfig() *config.Config {
	cfg := config.Default()
	cfg.Server.SecureServing, cfg.Server.CertPath, cfg.Server.MetricsCertDir = true, TLSDir, TLSDir
	return &cfg
}
