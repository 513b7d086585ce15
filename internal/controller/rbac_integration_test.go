package controller

import (
	"context"
	"os"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	"github.com/epd-dev/coordinator/test/harness/prereq"
)

// With --watch-namespace the manager needs nothing cluster-wide: running as a user whose only
// permissions are the rules of config/rbac/role.yaml as a Role in the watched namespace (what
// the Helm chart renders with watchNamespace), with the cache of CacheOptions(namespace), it
// reconciles a pipeline that uses every child kind and every reference kind to Ready=True.
// It runs its own API server: the suite's manager reconciles every namespace.
func TestManagerRunsWithANamespacedRole(t *testing.T) {
	prereq.KubebuilderAssets(t)
	g := gomega(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	crds, err := crdPaths()
	g.Expect(err).NotTo(HaveOccurred())
	env := &envtest.Environment{Scheme: NewScheme(), CRDDirectoryPaths: crds, ErrorIfCRDPathMissing: true}
	adminCfg, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = env.Stop() })
	admin, err := client.New(adminCfg, client.Options{Scheme: env.Scheme})
	g.Expect(err).NotTo(HaveOccurred())

	const ns, user = "pipelines", "system:serviceaccount:coordinator-system:coordinator-operator"
	for _, name := range []string{ns, "elsewhere"} {
		g.Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	}
	data, err := os.ReadFile("../../config/rbac/role.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	clusterRole := &rbacv1.ClusterRole{}
	g.Expect(yaml.UnmarshalStrict(data, clusterRole)).To(Succeed())
	g.Expect(admin.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "manager-role"}, Rules: clusterRole.Rules})).To(Succeed())
	g.Expect(admin.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "manager-rolebinding"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "manager-role"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	})).To(Succeed())

	operator, err := env.AddUser(envtest.User{Name: user}, adminCfg)
	g.Expect(err).NotTo(HaveOccurred())
	operatorCfg := operator.Config()
	restricted, err := client.New(operatorCfg, client.Options{Scheme: env.Scheme})
	g.Expect(err).NotTo(HaveOccurred())
	// The user really is restricted: nothing cluster-wide, nothing in another namespace.
	g.Eventually(func(g Gomega) {
		g.Expect(restricted.List(ctx, &corev1.ConfigMapList{}, client.InNamespace(ns))).To(Succeed())
	}).Should(Succeed(), "the Role is in effect")
	for _, opts := range [][]client.ListOption{nil, {client.InNamespace("elsewhere")}} {
		err := restricted.List(ctx, &coordinatorv1alpha1.CoordinatorPipelineList{}, opts...)
		g.Expect(apierrors.IsForbidden(err)).To(BeTrue(), "listing CoordinatorPipelines %v: %v", opts, err)
	}

	mgr, err := ctrl.NewManager(operatorCfg, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  CacheOptions(ns),
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	g.Expect(err).NotTo(HaveOccurred())
	r := &CoordinatorPipelineReconciler{Client: mgr.GetClient(), DefaultImage: "registry.test/coordinator:test", WatchNamespace: ns}
	g.Expect(r.SetupWithManager(ctx, mgr)).To(Succeed())
	g.Expect(r.poolAPI && r.gatewayAPI && r.routeAPI).To(BeTrue(), "API discovery needs no permission")
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	// A pipeline that uses every kind the manager reads or writes. e plays the other controllers.
	e := &testEnv{client: admin}
	e.setGatewayAddress(g, e.createGateway(g, ns, "gw"), "10.0.0.7")
	pool := e.createPool(t, ns, "pool")
	g.Expect(admin.Create(ctx, tlsSecret(ns, "epd-tls", "cert"))).To(Succeed())
	// A tokenizer ConfigMap: read through the manager's metadata cache of ConfigMaps and a GET.
	g.Expect(admin.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "qwen-tokenizer"}, Data: testTokenizerFiles(t)})).To(Succeed())
	cp := newPipeline(ns, "epd", withTokenizers(qwenDir, configMapTokenizer("qwen", "qwen-tokenizer")), func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.UID, cp.Generation = "", 0
		cp.Spec.InferencePoolRef.Name = pool.Name
		cp.Spec.Gateway = coordinatorv1alpha1.GatewaySpec{GatewayRef: &coordinatorv1alpha1.GatewayReference{Name: "gw"}}
		cp.Spec.Route = &coordinatorv1alpha1.RouteSpec{}
		cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "epd-tls"}
		cp.Spec.DisruptionBudget = &coordinatorv1alpha1.DisruptionBudgetSpec{}
		cp.Spec.NetworkPolicy = &coordinatorv1alpha1.NetworkPolicySpec{Enabled: true}
	})
	g.Expect(admin.Create(ctx, cp)).To(Succeed())

	get := func(g Gomega, obj client.Object) {
		g.Expect(admin.Get(ctx, client.ObjectKey{Namespace: ns, Name: obj.GetName()}, obj)).To(Succeed())
	}
	g.Eventually(func(g Gomega) {
		for _, obj := range []client.Object{
			&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "epd-config"}}, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "epd"}},
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "epd"}}, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "epd"}},
			&policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "epd"}}, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "epd"}},
			&gatewayv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Name: "epd"}},
		} {
			get(g, obj)
		}
	}).Should(Succeed(), "the manager creates every child")

	// The manager sees the other controllers' status writes through its namespaced watches.
	e.markDeploymentAvailable(g, ns, "epd")
	parent, _ := routeParent(cp)
	e.setRouteStatus(g, ns, "epd", parent, routeCondition(gatewayv1.RouteConditionAccepted, metav1.ConditionTrue, "Accepted", ""))
	g.Eventually(func(g Gomega) {
		got := &coordinatorv1alpha1.CoordinatorPipeline{ObjectMeta: metav1.ObjectMeta{Name: "epd"}}
		get(g, got)
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		expectCondition(g, got, coordinatorv1alpha1.ConditionGatewayResolved, metav1.ConditionTrue, coordinatorv1alpha1.ReasonResolved)
		expectCondition(g, got, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		expectCondition(g, got, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionFalse, coordinatorv1alpha1.ReasonAsExpected)
		expectCondition(g, got, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	}).Should(Succeed())

	// A Gateway in a namespace the manager does not watch is reported, not retried.
	e.createGateway(g, "elsewhere", "gw")
	other := newPipeline(ns, "other", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.UID, cp.Generation = "", 0
		cp.Spec.Gateway = coordinatorv1alpha1.GatewaySpec{GatewayRef: &coordinatorv1alpha1.GatewayReference{Name: "gw", Namespace: "elsewhere"}}
	})
	g.Expect(admin.Create(ctx, other)).To(Succeed())
	g.Eventually(func(g Gomega) {
		got := &coordinatorv1alpha1.CoordinatorPipeline{ObjectMeta: metav1.ObjectMeta{Name: "other"}}
		get(g, got)
		g.Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		c := expectCondition(g, got, coordinatorv1alpha1.ConditionGatewayResolved, metav1.ConditionFalse, coordinatorv1alpha1.ReasonNamespaceNotWatched)
		g.Expect(c.Message).To(Equal("spec.gateway.gatewayRef.namespace: Gateway elsewhere/gw is outside namespace pipelines, the only one the operator watches (--watch-namespace)"))
		expectCondition(g, got, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionFalse, coordinatorv1alpha1.ReasonAsExpected)
	}).Should(Succeed())

	g.Eventually(func(g Gomega) {
		var events eventsv1.EventList
		g.Expect(admin.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
		g.Expect(events.Items).NotTo(BeEmpty(), "the manager may write events in the namespace")
	}).Should(Succeed())
}
