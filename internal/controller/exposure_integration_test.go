package controller

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// The optional children against a real API server with the Gateway API CRDs (standard
// channel): envtest runs no gateway controller, so the tests write the HTTPRoute's status the
// way one would.

// setRouteStatus plays the gateway controller: it reports conds for the parent on the route.
func (e *testEnv) setRouteStatus(g *WithT, namespace, name string, parent gatewayv1.ParentReference, conds ...metav1.Condition) {
	ctx := context.Background()
	g.Eventually(func(g Gomega) {
		route := &gatewayv1.HTTPRoute{}
		g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, route)).To(Succeed())
		for i := range conds {
			conds[i].ObservedGeneration = route.Generation
			conds[i].LastTransitionTime = metav1.Now()
		}
		route.Status.Parents = []gatewayv1.RouteParentStatus{{ParentRef: parent, ControllerName: "example.net/gateway-controller", Conditions: conds}}
		g.Expect(e.client.Status().Update(ctx, route)).To(Succeed())
	}).Should(Succeed())
}

// createGateway creates a Gateway named name with one HTTP listener "http" on port 80.
func (e *testEnv) createGateway(g *WithT, namespace, name string) *gatewayv1.Gateway {
	gw := &gatewayv1.Gateway{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: gatewayv1.GatewaySpec{
			GatewayClassName: "test",
			Listeners:        []gatewayv1.Listener{{Name: "http", Protocol: gatewayv1.HTTPProtocolType, Port: 80}},
		},
	}
	g.Expect(e.client.Create(context.Background(), gw)).To(Succeed())
	return gw
}

// setGatewayAddress plays the gateway controller: it publishes addr as the Gateway's address.
func (e *testEnv) setGatewayAddress(g *WithT, gw *gatewayv1.Gateway, addr string) {
	ctx := context.Background()
	g.Eventually(func(g Gomega) {
		g.Expect(e.client.Get(ctx, client.ObjectKeyFromObject(gw), gw)).To(Succeed())
		gw.Status.Addresses = []gatewayv1.GatewayStatusAddress{{Type: ptr.To(gatewayv1.IPAddressType), Value: addr}}
		g.Expect(e.client.Status().Update(ctx, gw)).To(Succeed())
	}).Should(Succeed())
}

func routeCondition(t gatewayv1.RouteConditionType, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	return metav1.Condition{Type: string(t), Status: status, Reason: reason, Message: message}
}

func TestRouteAcceptedFollowsTheGatewayController(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Route = &coordinatorv1alpha1.RouteSpec{ParentRef: &coordinatorv1alpha1.RouteParentReference{Name: "inference-gateway", Namespace: "infra"}}
	})
	e.markDeploymentAvailable(g, ns, "epd")

	// Created, owned, and Pending until a gateway controller reports: not Ready.
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionRouteAccepted, metav1.ConditionUnknown, coordinatorv1alpha1.ReasonPending)
		g.Expect(c.Message).To(Equal("HTTPRoute epd: no gateway controller has reported on Gateway.gateway.networking.k8s.io infra/inference-gateway yet"))
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonRouteNotAccepted)
	})
	route := &gatewayv1.HTTPRoute{}
	g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd"}, route)).To(Succeed())
	expectOwnedBy(g, route, cp)
	g.Expect(route.Spec.Rules).To(HaveLen(2))
	g.Expect(route.Spec.Rules[0].Matches).To(HaveLen(3))
	g.Expect(route.Spec.Rules[0].BackendRefs[0].Kind).To(Equal(ptr.To(gatewayv1.Kind("InferencePool"))))
	g.Expect(route.Spec.Rules[1].BackendRefs[0].Name).To(BeEquivalentTo("epd"))

	// The gateway controller echoes the parent as written in the spec.
	parent := route.Spec.ParentRefs[0]
	e.setRouteStatus(g, ns, "epd", parent,
		routeCondition(gatewayv1.RouteConditionAccepted, metav1.ConditionTrue, "Accepted", "Route is accepted"),
		routeCondition(gatewayv1.RouteConditionResolvedRefs, metav1.ConditionTrue, "ResolvedRefs", "Resolved all the Object references"))
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionRouteAccepted, metav1.ConditionTrue, coordinatorv1alpha1.ReasonAccepted)
		g.Expect(c.Message).To(ContainSubstring("example.net/gateway-controller"))
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})

	// Rejected (e.g. the listener does not allow routes from this namespace).
	e.setRouteStatus(g, ns, "epd", parent,
		routeCondition(gatewayv1.RouteConditionAccepted, metav1.ConditionFalse, "NotAllowedByListeners", "no listener allows routes from "+ns))
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionRouteAccepted, metav1.ConditionFalse, coordinatorv1alpha1.ReasonNotAccepted)
		g.Expect(c.Message).To(ContainSubstring("Accepted=False (NotAllowedByListeners): no listener allows routes from " + ns))
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonRouteNotAccepted)
		expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionFalse, coordinatorv1alpha1.ReasonAsExpected)
	})
	g.Eventually(func(g Gomega) {
		var events eventsv1.EventList
		g.Expect(e.client.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
		g.Expect(events.Items).To(ContainElement(And(
			HaveField("Type", "Warning"), HaveField("Reason", "NotAccepted"),
			HaveField("Note", ContainSubstring("NotAllowedByListeners")))))
	}).Should(Succeed())

	// A spec change reaches the route.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Route.EPPProfileMatch = coordinatorv1alpha1.EPPProfileMatchRegularExpression
		cp.Spec.Route.RequestTimeout = "15m"
	})
	g.Eventually(func(g Gomega) {
		g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd"}, route)).To(Succeed())
		g.Expect(route.Spec.Rules[0].Matches).To(HaveLen(1))
		g.Expect(route.Spec.Rules[0].Matches[0].Headers[0].Value).To(Equal(".+"))
		g.Expect(route.Spec.Rules[1].Timeouts.Request).To(Equal(ptr.To(gatewayv1.Duration("15m"))))
	}).Should(Succeed())

	// Removing spec.route deletes the route and its condition; Ready no longer waits for it.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.Route = nil })
	g.Eventually(func() bool {
		return apierrors.IsNotFound(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd"}, &gatewayv1.HTTPRoute{}))
	}).Should(BeTrue())
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		g.Expect(meta.FindStatusCondition(cp.Status.Conditions, string(coordinatorv1alpha1.ConditionRouteAccepted))).To(BeNil())
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})
}

// With spec.gateway.gatewayRef, `route: {}` attaches to that Gateway (the one whose address the
// coordinator sends its legs to), and a backend the gateway cannot resolve is reported.
func TestRouteAttachesToTheReferencedGateway(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.setGatewayAddress(g, e.createGateway(g, ns, "inference-gateway"), "10.1.2.3")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Gateway = coordinatorv1alpha1.GatewaySpec{GatewayRef: &coordinatorv1alpha1.GatewayReference{Name: "inference-gateway", SectionName: "http"}}
		cp.Spec.Route = &coordinatorv1alpha1.RouteSpec{}
	})

	route := &gatewayv1.HTTPRoute{}
	g.Eventually(func(g Gomega) {
		g.Expect(e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd"}, route)).To(Succeed())
	}).Should(Succeed())
	g.Expect(route.Spec.ParentRefs).To(HaveLen(1))
	g.Expect(route.Spec.ParentRefs[0].Name).To(BeEquivalentTo("inference-gateway"))
	g.Expect(route.Spec.ParentRefs[0].SectionName).To(Equal(ptr.To(gatewayv1.SectionName("http"))))
	g.Expect(route.Spec.Rules[0].Matches).To(HaveLen(3), "the CRD defaults eppProfileMatch to Exact")

	// A gateway controller that writes the parent with the defaults dropped still matches.
	e.setRouteStatus(g, ns, "epd", gatewayv1.ParentReference{Name: "inference-gateway", SectionName: ptr.To(gatewayv1.SectionName("http"))},
		routeCondition(gatewayv1.RouteConditionAccepted, metav1.ConditionTrue, "Accepted", ""),
		routeCondition(gatewayv1.RouteConditionResolvedRefs, metav1.ConditionFalse, "InvalidKind", "InferencePool backends are not supported"))
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionRouteAccepted, metav1.ConditionFalse, coordinatorv1alpha1.ReasonRefsNotResolved)
		g.Expect(c.Message).To(ContainSubstring("InferencePool backends are not supported"))
		g.Expect(cp.Status.GatewayAddress).To(Equal("http://10.1.2.3:80"))
	})
}

func TestDisruptionBudgetAndNetworkPolicyLifecycle(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	gatewayNS := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "infra"}}}
	cp := e.readyPipeline(t, g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.DisruptionBudget = &coordinatorv1alpha1.DisruptionBudgetSpec{}
		cp.Spec.NetworkPolicy = &coordinatorv1alpha1.NetworkPolicySpec{
			Enabled:     true,
			IngressFrom: []networkingv1.NetworkPolicyPeer{gatewayNS},
			Egress:      &coordinatorv1alpha1.NetworkPolicyEgress{GatewayTo: []networkingv1.NetworkPolicyPeer{gatewayNS}},
		}
	})
	key := client.ObjectKey{Namespace: ns, Name: "epd"}

	pdb := &policyv1.PodDisruptionBudget{}
	np := &networkingv1.NetworkPolicy{}
	g.Expect(e.client.Get(ctx, key, pdb)).To(Succeed())
	expectOwnedBy(g, pdb, cp)
	g.Expect(pdb.Spec.MaxUnavailable).To(Equal(ptr.To(intstr.FromInt32(1))))
	g.Expect(pdb.Spec.Selector.MatchLabels).To(Equal(selectorLabels(cp)))
	g.Expect(e.client.Get(ctx, key, np)).To(Succeed())
	expectOwnedBy(g, np, cp)
	g.Expect(np.Spec.PolicyTypes).To(ConsistOf(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress))
	g.Expect(np.Spec.Ingress).To(HaveLen(2), "API and metrics ports")
	g.Expect(np.Spec.Ingress[0].From).To(Equal([]networkingv1.NetworkPolicyPeer{gatewayNS}))
	g.Expect(np.Spec.Egress).To(HaveLen(2), "DNS and the gateway")
	g.Expect(np.Spec.Egress[1].Ports[0].Port).To(Equal(ptr.To(intstr.FromInt32(80))), "the port of %s", testGateway)

	// Hand edits are reverted.
	pdb.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(5))
	g.Expect(e.client.Update(ctx, pdb)).To(Succeed())
	g.Eventually(func(g Gomega) {
		g.Expect(e.client.Get(ctx, key, pdb)).To(Succeed())
		g.Expect(pdb.Spec.MaxUnavailable).To(Equal(ptr.To(intstr.FromInt32(1))))
	}).Should(Succeed())

	// Spec changes reach them.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.DisruptionBudget = &coordinatorv1alpha1.DisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromString("50%"))}
		cp.Spec.NetworkPolicy.Egress = nil
	})
	g.Eventually(func(g Gomega) {
		g.Expect(e.client.Get(ctx, key, pdb)).To(Succeed())
		g.Expect(pdb.Spec.MinAvailable).To(Equal(ptr.To(intstr.FromString("50%"))))
		g.Expect(pdb.Spec.MaxUnavailable).To(BeNil())
		g.Expect(e.client.Get(ctx, key, np)).To(Succeed())
		g.Expect(np.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{networkingv1.PolicyTypeIngress}))
		g.Expect(np.Spec.Egress).To(BeEmpty())
	}).Should(Succeed())

	// Disabling the policy and removing the budget delete both; the pipeline stays Ready.
	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.DisruptionBudget = nil
		cp.Spec.NetworkPolicy.Enabled = false
	})
	g.Eventually(func(g Gomega) {
		g.Expect(apierrors.IsNotFound(e.client.Get(ctx, key, &policyv1.PodDisruptionBudget{}))).To(BeTrue())
		g.Expect(apierrors.IsNotFound(e.client.Get(ctx, key, &networkingv1.NetworkPolicy{}))).To(BeTrue())
	}).Should(Succeed())
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})
}

// A PodDisruptionBudget of the same name that the pipeline does not control is a conflict, and
// turning the budget off never deletes it.
func TestForeignDisruptionBudgetIsLeftAlone(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	foreign := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "epd"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(0))},
	}
	g.Expect(e.client.Create(ctx, foreign)).To(Succeed())
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.DisruptionBudget = &coordinatorv1alpha1.DisruptionBudgetSpec{}
	})
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionTrue, coordinatorv1alpha1.ReasonChildConflict)
		g.Expect(c.Message).To(ContainSubstring("PodDisruptionBudget epd exists and is not controlled by this CoordinatorPipeline"))
	})

	e.update(g, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.DisruptionBudget = nil })
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionFalse, coordinatorv1alpha1.ReasonAsExpected)
	})
	// The reconcile that reported Degraded=False has run the PodDisruptionBudget phase; so has a
	// forced one after it.
	_, err := e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: ns, Name: "epd"}})
	g.Expect(err).NotTo(HaveOccurred())
	live := &policyv1.PodDisruptionBudget{}
	g.Expect(e.client.Get(ctx, client.ObjectKeyFromObject(foreign), live)).To(Succeed())
	g.Expect(live.UID).To(Equal(foreign.UID))
	g.Expect(live.DeletionTimestamp).To(BeNil())
}

// The optional children, once applied and defaulted by the API server, are not written again.
func TestSteadyOptionalChildrenAreNotRewritten(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Route = &coordinatorv1alpha1.RouteSpec{ParentRef: &coordinatorv1alpha1.RouteParentReference{Name: "gw"}, RequestTimeout: "10m"}
		cp.Spec.DisruptionBudget = &coordinatorv1alpha1.DisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1))}
		cp.Spec.NetworkPolicy = &coordinatorv1alpha1.NetworkPolicySpec{Enabled: true, Egress: &coordinatorv1alpha1.NetworkPolicyEgress{}}
		cp.Spec.Autoscaling = &coordinatorv1alpha1.AutoscalingSpec{MaxReplicas: 4, TargetCPUUtilizationPercent: ptr.To[int32](80), TargetInFlightRequests: ptr.To[int32](8)}
	})
	route := &gatewayv1.HTTPRoute{}
	g.Eventually(func() error {
		return e.client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "epd"}, route)
	}).Should(Succeed())
	e.setRouteStatus(g, ns, "epd", route.Spec.ParentRefs[0],
		routeCondition(gatewayv1.RouteConditionAccepted, metav1.ConditionTrue, "Accepted", ""),
		routeCondition(gatewayv1.RouteConditionResolvedRefs, metav1.ConditionTrue, "ResolvedRefs", ""))
	e.markDeploymentAvailable(g, ns, "epd")
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})
	key := client.ObjectKey{Namespace: ns, Name: "epd"}
	snapshot := func(g Gomega) map[string]string {
		rv := map[string]string{}
		for kind, obj := range map[string]client.Object{
			"CoordinatorPipeline": &coordinatorv1alpha1.CoordinatorPipeline{}, "HTTPRoute": &gatewayv1.HTTPRoute{},
			"PodDisruptionBudget": &policyv1.PodDisruptionBudget{}, "NetworkPolicy": &networkingv1.NetworkPolicy{},
			"HorizontalPodAutoscaler": &autoscalingv2.HorizontalPodAutoscaler{},
		} {
			g.Expect(e.client.Get(ctx, key, obj)).To(Succeed())
			rv[kind] = obj.GetResourceVersion()
		}
		return rv
	}
	before, events := snapshot(g), e.events.count(ns, "epd")
	for range 3 {
		_, err := e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		g.Expect(err).NotTo(HaveOccurred())
	}
	g.Expect(snapshot(g)).To(Equal(before))
	g.Expect(e.events.count(ns, "epd")).To(Equal(events), "events emitted")
}
