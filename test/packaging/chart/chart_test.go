package chart_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/epd-dev/coordinator/internal/packaging"
	"github.com/epd-dev/coordinator/test/internal/makefile"
)

// `helm lint --strict` equivalent: no message of any severity, with default and non-default
// values (the schema is part of lint).
func TestChartLints(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for name, vals := range valueSets {
		t.Run(name, func(t *testing.T) {
			linter := lint.AllWithKubeVersion(chartDir, vals, namespace, kv)
			for _, m := range linter.Messages {
				t.Errorf("helm lint: %s", m)
			}
			if linter.HighestSeverity > support.UnknownSev {
				t.Errorf("helm lint: highest severity %d", linter.HighestSeverity)
			}
		})
	}
}

func TestDefaultRender(t *testing.T) {
	g := NewWithT(t)
	r := render(t, namespace, nil)
	version := appVersion(t)

	kinds := map[string]int{}
	for _, o := range r.objs {
		kinds[o.GetKind()]++
		if o.GetKind() != "CustomResourceDefinition" && o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" {
			g.Expect(o.GetNamespace()).To(Equal(namespace), "%s %s", o.GetKind(), o.GetName())
		}
		g.Expect(o.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/managed-by", "Helm"), "%s %s", o.GetKind(), o.GetName())
		g.Expect(o.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/instance", releaseName), "%s %s", o.GetKind(), o.GetName())
	}
	g.Expect(kinds).To(Equal(map[string]int{
		"CustomResourceDefinition": 1, "ServiceAccount": 1, "Deployment": 1, "Service": 1,
		"ClusterRole": 6, "ClusterRoleBinding": 2, "Role": 1, "RoleBinding": 1,
	}))

	dep := r.deployment(t)
	g.Expect(dep.Name).To(Equal("coordinator-operator-controller-manager"))
	c := dep.Spec.Template.Spec.Containers[0]
	g.Expect(c.Image).To(Equal("ghcr.io/epd-dev/coordinator-operator:v" + version))
	g.Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: packaging.CoordinatorImageEnv, Value: "ghcr.io/epd-dev/coordinator:v" + version}))
	g.Expect(c.Args).To(Equal([]string{
		"--leader-elect", "--health-probe-bind-address=:8081", "--metrics-bind-address=:8443", "--metrics-secure=true",
		"--zap-log-level=info", "--max-concurrent-reconciles=4",
	}))
	expectRestricted(g, dep.Spec.Template.Spec)
	g.Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceCPU))
	g.Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceMemory))
	g.Expect(dep.Spec.Template.Spec.NodeSelector).To(BeEmpty())

	// Every binding names the operator's ServiceAccount and a role of the render.
	sa := r.get(t, "ServiceAccount", "")
	g.Expect(dep.Spec.Template.Spec.ServiceAccountName).To(Equal(sa.GetName()))
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, b := range packaging.Find(r.objs, kind) {
			binding := fromUnstructured[rbacv1.RoleBinding](t, b)
			g.Expect(binding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.GetName(), Namespace: namespace}}))
			r.get(t, binding.RoleRef.Kind, binding.RoleRef.Name)
		}
	}

	svc := fromUnstructured[corev1.Service](t, r.get(t, "Service", ""))
	g.Expect(svc.Spec.Selector).To(Equal(dep.Spec.Selector.MatchLabels))
	g.Expect(svc.Spec.Ports[0].TargetPort.StrVal).To(Equal("metrics"))
	g.Expect(svc.Spec.Ports[0].Name).To(Equal("https"))

	crd := r.get(t, "CustomResourceDefinition", "")
	g.Expect(crd.GetAnnotations()).To(HaveKeyWithValue("helm.sh/resource-policy", "keep"))

	g.Expect(r.notes).To(ContainSubstring("kubectl -n coordinator-system rollout status deployment/coordinator-operator-controller-manager"))
	g.Expect(r.notes).To(ContainSubstring("ghcr.io/epd-dev/coordinator:v" + version))
}

func expectRestricted(g Gomega, pod corev1.PodSpec) {
	g.Expect(pod.SecurityContext.RunAsNonRoot).To(Equal(ptr.To(true)))
	g.Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
	for _, c := range pod.Containers {
		g.Expect(c.SecurityContext.AllowPrivilegeEscalation).To(Equal(ptr.To(false)), c.Name)
		g.Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(Equal(ptr.To(true)), c.Name)
		g.Expect(c.SecurityContext.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}), c.Name)
	}
}

// The chart's CRD is the controller-gen CRD of config/crd/bases, field for field.
func TestChartCRDMatchesConfig(t *testing.T) {
	g := NewWithT(t)
	data, err := os.ReadFile(filepath.Join(root, "config/crd/bases/coordinator.epd.dev_coordinatorpipelines.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	want := &apiextensionsv1.CustomResourceDefinition{}
	g.Expect(yaml.UnmarshalStrict(data, want)).To(Succeed())

	got := fromUnstructured[apiextensionsv1.CustomResourceDefinition](t, render(t, namespace, nil).get(t, "CustomResourceDefinition", ""))
	g.Expect(got.Name).To(Equal(want.Name))
	if !equality.Semantic.DeepEqual(got.Spec, want.Spec) {
		t.Fatalf("the chart's CRD differs from config/crd/bases: run `make helm-chart`")
	}
}

// The chart's roles carry exactly the rules of config/rbac (role.yaml from the controller-gen
// markers, and the hand-written ones), and every role of config/default is in the chart.
func TestChartRBACMatchesConfig(t *testing.T) {
	g := NewWithT(t)
	r := render(t, namespace, nil)

	data, err := os.ReadFile(filepath.Join(root, "config/rbac/role.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	managerRole := &rbacv1.ClusterRole{}
	g.Expect(yaml.UnmarshalStrict(data, managerRole)).To(Succeed())
	chartManager := fromUnstructured[rbacv1.ClusterRole](t, r.get(t, "ClusterRole", releaseName+"-manager-role"))
	g.Expect(chartManager.Rules).To(Equal(managerRole.Rules), "config/rbac/role.yaml vs the chart: run `make helm-chart`")

	objs, err := packaging.Kustomize(root, "config/default")
	g.Expect(err).NotTo(HaveOccurred())
	for _, kind := range []string{"ClusterRole", "Role"} {
		for _, o := range packaging.Find(objs, kind) {
			want := fromUnstructured[rbacv1.Role](t, o)
			got := fromUnstructured[rbacv1.Role](t, r.get(t, kind, releaseName+"-"+packaging.RoleSuffix(o.GetName())))
			g.Expect(got.Rules).To(Equal(want.Rules), "%s %s", kind, o.GetName())
			for k, v := range want.Labels {
				if strings.HasPrefix(k, "rbac.authorization.k8s.io/") {
					g.Expect(got.Labels).To(HaveKeyWithValue(k, v), "%s %s aggregation label", kind, o.GetName())
				}
			}
		}
		g.Expect(r.count(kind)).To(Equal(len(packaging.Find(objs, kind))), "number of %ss", kind)
	}
}

// The chart's manager Deployment runs the manager like config/manager does: command, probes,
// ports, security contexts, default resources and volumes.
func TestChartDeploymentMatchesKustomize(t *testing.T) {
	g := NewWithT(t)
	objs, err := packaging.Kustomize(root, "config/default")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(packaging.Find(objs, "Deployment")).To(HaveLen(1))
	kDep := fromUnstructured[struct {
		Spec struct {
			Template corev1.PodTemplateSpec `json:"template"`
		} `json:"spec"`
	}](t, packaging.Find(objs, "Deployment")[0]).Spec.Template.Spec
	cDep := render(t, namespace, nil).deployment(t).Spec.Template.Spec

	g.Expect(cDep.SecurityContext).To(Equal(kDep.SecurityContext))
	g.Expect(cDep.TerminationGracePeriodSeconds).To(Equal(kDep.TerminationGracePeriodSeconds))
	kc, cc := kDep.Containers[0], cDep.Containers[0]
	g.Expect(cc.Name).To(Equal(kc.Name))
	g.Expect(cc.Command).To(Equal(kc.Command))
	g.Expect(cc.SecurityContext).To(Equal(kc.SecurityContext))
	g.Expect(cc.LivenessProbe).To(Equal(kc.LivenessProbe))
	g.Expect(cc.ReadinessProbe).To(Equal(kc.ReadinessProbe))
	g.Expect(cc.Ports).To(Equal(kc.Ports))
	g.Expect(cc.Resources).To(Equal(kc.Resources))
	g.Expect(cc.VolumeMounts).To(Equal(kc.VolumeMounts))
	g.Expect(cDep.Volumes).To(Equal(kDep.Volumes))
	for _, arg := range kc.Args {
		g.Expect(cc.Args).To(ContainElement(arg))
	}
	g.Expect(slices.ContainsFunc(cc.Env, func(e corev1.EnvVar) bool { return e.Name == packaging.CoordinatorImageEnv })).To(BeTrue())
}

func TestNonDefaultValues(t *testing.T) {
	toleration := corev1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "control-plane", Effect: corev1.TaintEffectNoSchedule}
	tests := map[string]struct {
		vals  string // YAML, as in a values file
		check func(g Gomega, r rendered)
	}{
		"node scheduling": {
			vals: `
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: control-plane, effect: NoSchedule}]
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/arch, operator: In, values: [amd64, arm64]}]}]
priorityClassName: system-cluster-critical`,
			check: func(g Gomega, r rendered) {
				pod := r.deployment(t).Spec.Template.Spec
				g.Expect(pod.NodeSelector).To(Equal(map[string]string{"kubernetes.io/os": "linux"}))
				g.Expect(pod.Tolerations).To(Equal([]corev1.Toleration{toleration}))
				g.Expect(pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Values).
					To(Equal([]string{"amd64", "arm64"}))
				g.Expect(pod.PriorityClassName).To(Equal("system-cluster-critical"))
			},
		},
		"images: tags, digest, pull secrets": {
			vals: `
image: {repository: registry.example.com/coordinator-operator, digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", pullPolicy: Always}
coordinator: {image: {repository: registry.example.com/coordinator, tag: v9.9.9}}
imagePullSecrets: [{name: regcred}]`,
			check: func(g Gomega, r rendered) {
				pod := r.deployment(t).Spec.Template.Spec
				g.Expect(pod.Containers[0].Image).To(Equal("registry.example.com/coordinator-operator@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"))
				g.Expect(pod.Containers[0].ImagePullPolicy).To(Equal(corev1.PullAlways))
				g.Expect(pod.Containers[0].Env).To(ContainElement(corev1.EnvVar{Name: packaging.CoordinatorImageEnv, Value: "registry.example.com/coordinator:v9.9.9"}))
				g.Expect(pod.ImagePullSecrets).To(Equal([]corev1.LocalObjectReference{{Name: "regcred"}}))
			},
		},
		"resources, replicas, log level, watch namespace, concurrency": {
			vals: `
replicaCount: 2
resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {cpu: "1", memory: 512Mi}}
logLevel: debug
watchNamespace: inference
maxConcurrentReconciles: 8`,
			check: func(g Gomega, r rendered) {
				dep := r.deployment(t)
				g.Expect(*dep.Spec.Replicas).To(BeEquivalentTo(2))
				c := dep.Spec.Template.Spec.Containers[0]
				g.Expect(c.Resources.Limits.Cpu().String()).To(Equal("1"))
				g.Expect(c.Resources.Requests.Memory().String()).To(Equal("128Mi"))
				g.Expect(c.Args).To(ContainElements("--zap-log-level=debug", "--watch-namespace=inference", "--max-concurrent-reconciles=8", "--leader-elect"))
				g.Expect(r.notes).To(ContainSubstring("Only CoordinatorPipelines in namespace inference are reconciled"))
			},
		},
		"watch namespace: the manager gets a Role there, nothing cluster-wide": {
			vals: `watchNamespace: inference`,
			check: func(g Gomega, r rendered) {
				data, err := os.ReadFile(filepath.Join(root, "config/rbac/role.yaml"))
				g.Expect(err).NotTo(HaveOccurred())
				managerRules := &rbacv1.ClusterRole{}
				g.Expect(yaml.UnmarshalStrict(data, managerRules)).To(Succeed())

				role := fromUnstructured[rbacv1.Role](t, r.get(t, "Role", releaseName+"-manager-role"))
				g.Expect(role.Namespace).To(Equal("inference"))
				g.Expect(role.Rules).To(Equal(managerRules.Rules))
				binding := fromUnstructured[rbacv1.RoleBinding](t, r.get(t, "RoleBinding", releaseName+"-manager-rolebinding"))
				g.Expect(binding.Namespace).To(Equal("inference"))
				g.Expect(binding.RoleRef).To(Equal(rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}))
				g.Expect(binding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: releaseName, Namespace: namespace}}))
				g.Expect(r.count("Role")).To(Equal(2), "the manager's and the leader-election Role")
				g.Expect(r.count("RoleBinding")).To(Equal(2))

				// What stays cluster-wide for the operator's ServiceAccount is the metrics
				// authentication role: TokenReviews and SubjectAccessReviews have no namespace.
				roles := map[string]*rbacv1.ClusterRole{}
				for _, o := range packaging.Find(r.objs, "ClusterRole") {
					roles[o.GetName()] = fromUnstructured[rbacv1.ClusterRole](t, o)
				}
				g.Expect(roles).NotTo(HaveKey(releaseName + "-manager-role"))
				bindings := packaging.Find(r.objs, "ClusterRoleBinding")
				g.Expect(bindings).To(HaveLen(1))
				b := fromUnstructured[rbacv1.ClusterRoleBinding](t, bindings[0])
				for _, rule := range roles[b.RoleRef.Name].Rules {
					g.Expect(rule.APIGroups).To(ConsistOf(BeElementOf("authentication.k8s.io", "authorization.k8s.io")), "%+v", rule)
					g.Expect(rule.Verbs).To(Equal([]string{"create"}), "%+v", rule)
				}
			},
		},
		"watch namespace without secure metrics: no ClusterRoleBinding at all": {
			vals: `{watchNamespace: inference, metrics: {secure: false}}`,
			check: func(g Gomega, r rendered) {
				g.Expect(r.count("ClusterRoleBinding")).To(BeZero())
				for _, o := range packaging.Find(r.objs, "ClusterRole") {
					g.Expect(o.GetLabels()).To(HaveKey(HavePrefix("rbac.authorization.k8s.io/aggregate-to-")), "only the user roles aggregated into admin, edit, view: %s", o.GetName())
				}
			},
		},
		"leader election off: no Lease role": {
			vals: `leaderElection: {enabled: false}`,
			check: func(g Gomega, r rendered) {
				g.Expect(r.deployment(t).Spec.Template.Spec.Containers[0].Args).NotTo(ContainElement("--leader-elect"))
				g.Expect(r.count("Role")).To(BeZero())
				g.Expect(r.count("RoleBinding")).To(BeZero())
			},
		},
		"metrics off: no Service, no metrics roles, endpoint disabled": {
			vals: `metrics: {enabled: false}`,
			check: func(g Gomega, r rendered) {
				c := r.deployment(t).Spec.Template.Spec.Containers[0]
				g.Expect(c.Args).To(ContainElement("--metrics-bind-address=0"))
				g.Expect(c.Ports).To(HaveLen(1))
				g.Expect(r.count("Service")).To(BeZero())
				g.Expect(r.count("ClusterRole")).To(Equal(4), "manager and the three aggregated roles")
				g.Expect(r.count("ClusterRoleBinding")).To(Equal(1))
			},
		},
		"plain-HTTP metrics on another port": {
			vals: `metrics: {secure: false, port: 8080, service: {port: 8080}}`,
			check: func(g Gomega, r rendered) {
				c := r.deployment(t).Spec.Template.Spec.Containers[0]
				g.Expect(c.Args).To(ContainElements("--metrics-bind-address=:8080", "--metrics-secure=false"))
				svc := fromUnstructured[corev1.Service](t, r.get(t, "Service", ""))
				g.Expect(svc.Spec.Ports[0].Name).To(Equal("http"))
				g.Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(8080))
				g.Expect(r.count("ClusterRole")).To(Equal(4))
			},
		},
		"CRD and RBAC managed elsewhere, existing ServiceAccount": {
			vals: `
crds: {install: false}
rbac: {create: false}
serviceAccount: {create: false, name: platform-operators}`,
			check: func(g Gomega, r rendered) {
				for _, kind := range []string{"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"} {
					g.Expect(r.count(kind)).To(BeZero(), kind)
				}
				g.Expect(r.deployment(t).Spec.Template.Spec.ServiceAccountName).To(Equal("platform-operators"))
				g.Expect(r.notes).To(ContainSubstring("crds.install=false"))
			},
		},
		"CRD removed with the release": {
			vals: `crds: {keep: false}`,
			check: func(g Gomega, r rendered) {
				g.Expect(r.get(t, "CustomResourceDefinition", "").GetAnnotations()).NotTo(HaveKey("helm.sh/resource-policy"))
			},
		},
		"no aggregated user roles": {
			vals: `rbac: {aggregateToDefaultRoles: false}`,
			check: func(g Gomega, r rendered) {
				g.Expect(r.count("ClusterRole")).To(Equal(3))
			},
		},
		"fullnameOverride names everything": {
			vals: `fullnameOverride: epd`,
			check: func(g Gomega, r rendered) {
				g.Expect(r.deployment(t).Name).To(Equal("epd-controller-manager"))
				r.get(t, "ClusterRole", "epd-manager-role")
				r.get(t, "Service", "epd-metrics")
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			vals := map[string]any{}
			g.Expect(yaml.Unmarshal([]byte(tc.vals), &vals)).To(Succeed())
			tc.check(g, render(t, namespace, vals))
		})
	}
}

// values.schema.json rejects what would render a broken operator.
func TestValuesSchemaRejects(t *testing.T) {
	tests := map[string]struct {
		vals    string
		wantErr string
	}{
		"unknown key":          {`replicas: 2`, "additional properties 'replicas' not allowed"},
		"replicas not integer": {`replicaCount: two`, "at '/replicaCount': got string, want integer"},
		"unknown log level":    {`logLevel: verbose`, "at '/logLevel'"},
		"bad digest":           {`image: {repository: x, digest: latest}`, "at '/image/digest': 'latest' does not match pattern"},
		"port out of range":    {`metrics: {port: 70000}`, "at '/metrics/port': maximum"},
		"bad pull policy":      {`image: {repository: x, pullPolicy: Sometimes}`, "at '/image/pullPolicy': value must be one of"},
		"watch namespace":      {`watchNamespace: Not_A_Namespace`, "at '/watchNamespace'"},
	}
	c := loadChart(t)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			vals := map[string]any{}
			if err := yaml.Unmarshal([]byte(tc.vals), &vals); err != nil {
				t.Fatal(err)
			}
			_, err := tryRender(c, namespace, vals)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("want an error containing %q, got %v", tc.wantErr, err)
			}
		})
	}
}

// The generated templates (CRD, roles) are what `make helm-chart` writes today.
func TestChartGeneratedTemplatesAreFresh(t *testing.T) {
	want, err := packaging.ChartFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	for rel, data := range want {
		got, err := os.ReadFile(filepath.Join(chartDir, rel))
		if err != nil || string(got) != string(data) {
			t.Errorf("%s/%s is stale: run `make helm-chart`", packaging.ChartDir, rel)
		}
	}
}

// The chart installs the operator version the Makefile releases.
func TestChartVersionFollowsTheMakefile(t *testing.T) {
	c := loadChart(t)
	want := makefile.Var(t, root, "OPERATOR_VERSION")
	if c.Metadata.AppVersion != want || c.Metadata.Version != want {
		t.Fatalf("Chart.yaml version %s, appVersion %s; the Makefile's OPERATOR_VERSION is %s", c.Metadata.Version, c.Metadata.AppVersion, want)
	}
	for _, v := range []struct{ name, want string }{
		{"IMG", "ghcr.io/epd-dev/coordinator-operator:v$(OPERATOR_VERSION)"},
		{"COORDINATOR_IMG", "ghcr.io/epd-dev/coordinator:v$(OPERATOR_VERSION)"},
	} {
		if got := makefile.Var(t, root, v.name); got != v.want {
			t.Errorf("Makefile %s ?= %s; the chart's default image is %s", v.name, got, v.want)
		}
	}
}

// valueSets are the values that reach every branch of the chart's templates.
var valueSets = map[string]map[string]any{
	"defaults":        nil,
	"watch namespace": {"watchNamespace": "inference"},
	"everything off": {
		"leaderElection": map[string]any{"enabled": false}, "metrics": map[string]any{"enabled": false},
		"rbac": map[string]any{"create": false}, "crds": map[string]any{"install": false},
		"serviceAccount": map[string]any{"create": false, "name": "existing"},
	},
}
