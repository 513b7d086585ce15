package controller

import (
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

func TestRouteParent(t *testing.T) {
	gatewayRef := func(ns, section string) func(*coordinatorv1alpha1.CoordinatorPipeline) {
		return func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
			cp.Spec.Gateway = coordinatorv1alpha1.GatewaySpec{GatewayRef: &coordinatorv1alpha1.GatewayReference{Name: "gw", Namespace: ns, SectionName: section}}
		}
	}
	gw := func(name string, ns, section *string) gatewayv1.ParentReference {
		ref := gatewayv1.ParentReference{Group: ptr.To(gatewayv1.Group("gateway.networking.k8s.io")), Kind: ptr.To(gatewayv1.Kind("Gateway")), Name: gatewayv1.ObjectName(name)}
		if ns != nil {
			ref.Namespace = ptr.To(gatewayv1.Namespace(*ns))
		}
		if section != nil {
			ref.SectionName = ptr.To(gatewayv1.SectionName(*section))
		}
		return ref
	}
	tests := map[string]struct {
		mutate []func(*coordinatorv1alpha1.CoordinatorPipeline)
		want   gatewayv1.ParentReference
		wantOK bool
	}{
		"neither route.parentRef nor gatewayRef": {wantOK: false},
		"from gatewayRef, same namespace": {
			mutate: []func(*coordinatorv1alpha1.CoordinatorPipeline){gatewayRef("", "")},
			want:   gw("gw", nil, nil), wantOK: true,
		},
		"from gatewayRef, explicit own namespace is left implicit": {
			mutate: []func(*coordinatorv1alpha1.CoordinatorPipeline){gatewayRef("ns", "")},
			want:   gw("gw", nil, nil), wantOK: true,
		},
		"from gatewayRef, other namespace and listener": {
			mutate: []func(*coordinatorv1alpha1.CoordinatorPipeline){gatewayRef("infra", "http")},
			want:   gw("gw", ptr.To("infra"), ptr.To("http")), wantOK: true,
		},
		"route.parentRef wins over gatewayRef": {
			mutate: []func(*coordinatorv1alpha1.CoordinatorPipeline){gatewayRef("infra", "http"), func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Route = &coordinatorv1alpha1.RouteSpec{ParentRef: &coordinatorv1alpha1.RouteParentReference{Name: "public", Namespace: "edge", SectionName: "https"}}
			}},
			want: gw("public", ptr.To("edge"), ptr.To("https")), wantOK: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			got, ok := routeParent(newPipeline("ns", "cp", tc.mutate...))
			g.Expect(ok).To(Equal(tc.wantOK))
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// routed returns a pipeline with spec.route attached to Gateway infra/gw, changed by mutate.
func routed(mutate func(*coordinatorv1alpha1.RouteSpec)) *coordinatorv1alpha1.CoordinatorPipeline {
	return newPipeline("ns", "cp", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Gateway = coordinatorv1alpha1.GatewaySpec{GatewayRef: &coordinatorv1alpha1.GatewayReference{Name: "gw", Namespace: "infra"}}
		cp.Spec.Route = &coordinatorv1alpha1.RouteSpec{EPPProfileMatch: coordinatorv1alpha1.EPPProfileMatchExact}
		if mutate != nil {
			mutate(cp.Spec.Route)
		}
	})
}

func TestDesiredHTTPRoute(t *testing.T) {
	exact := func(v string) gatewayv1.HTTPRouteMatch {
		return gatewayv1.HTTPRouteMatch{
			Path:    &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To("/")},
			Headers: []gatewayv1.HTTPHeaderMatch{{Type: ptr.To(gatewayv1.HeaderMatchExact), Name: "x-llm-d-epp-profile", Value: v}},
		}
	}
	tests := map[string]struct {
		cp    *coordinatorv1alpha1.CoordinatorPipeline
		check func(g Gomega, r *gatewayv1.HTTPRoute)
	}{
		"shape: owner, parent, profile-header legs to the pool, the rest to the coordinator Service": {
			cp: routed(nil),
			check: func(g Gomega, r *gatewayv1.HTTPRoute) {
				g.Expect(r.Name).To(Equal("cp"))
				g.Expect(r.Spec.ParentRefs).To(HaveLen(1))
				g.Expect(string(r.Spec.ParentRefs[0].Name)).To(Equal("gw"))
				g.Expect(*r.Spec.ParentRefs[0].Namespace).To(BeEquivalentTo("infra"))
				g.Expect(r.Spec.Hostnames).To(BeEmpty())
				g.Expect(r.Spec.Rules).To(HaveLen(2))

				legs := r.Spec.Rules[0]
				g.Expect(*legs.Name).To(BeEquivalentTo("epp-profile"))
				g.Expect(legs.Matches).To(Equal([]gatewayv1.HTTPRouteMatch{exact("encode"), exact("prefill"), exact("decode")}))
				g.Expect(legs.BackendRefs).To(HaveLen(1))
				pool := legs.BackendRefs[0].BackendObjectReference
				g.Expect(*pool.Group).To(BeEquivalentTo("inference.networking.k8s.io"))
				g.Expect(*pool.Kind).To(BeEquivalentTo("InferencePool"))
				g.Expect(pool.Name).To(BeEquivalentTo("pool"))
				g.Expect(pool.Port).To(BeNil(), "an InferencePool backend takes its ports from the pool")
				g.Expect(legs.Timeouts).To(BeNil())

				rest := r.Spec.Rules[1]
				g.Expect(*rest.Name).To(BeEquivalentTo("coordinator"))
				g.Expect(rest.Matches).To(HaveLen(1))
				g.Expect(rest.Matches[0].Headers).To(BeEmpty())
				g.Expect(*rest.Matches[0].Path.Value).To(Equal("/"))
				svc := rest.BackendRefs[0].BackendObjectReference
				g.Expect(*svc.Group).To(BeEquivalentTo(""))
				g.Expect(*svc.Kind).To(BeEquivalentTo("Service"))
				g.Expect(svc.Name).To(BeEquivalentTo("cp"))
				g.Expect(*svc.Port).To(BeEquivalentTo(ListenPort))
			},
		},
		"RegularExpression: one match for any profile value": {
			cp: routed(func(r *coordinatorv1alpha1.RouteSpec) {
				r.EPPProfileMatch = coordinatorv1alpha1.EPPProfileMatchRegularExpression
			}),
			check: func(g Gomega, r *gatewayv1.HTTPRoute) {
				g.Expect(r.Spec.Rules[0].Matches).To(HaveLen(1))
				g.Expect(r.Spec.Rules[0].Matches[0].Headers).To(Equal([]gatewayv1.HTTPHeaderMatch{
					{Type: ptr.To(gatewayv1.HeaderMatchRegularExpression), Name: "x-llm-d-epp-profile", Value: ".+"},
				}))
			},
		},
		"the rule matches the first of the pipeline's profile headers": {
			cp: func() *coordinatorv1alpha1.CoordinatorPipeline {
				cp := routed(nil)
				cp.Spec.Gateway.ProfileHeaders = []string{"EPP-Profile", "x-llm-d-epp-profile"}
				return cp
			}(),
			check: func(g Gomega, r *gatewayv1.HTTPRoute) {
				g.Expect(r.Spec.Rules[0].Matches).To(HaveLen(3))
				for _, m := range r.Spec.Rules[0].Matches {
					g.Expect(m.Headers).To(HaveLen(1))
					g.Expect(string(m.Headers[0].Name)).To(Equal("EPP-Profile"))
				}
			},
		},
		"unset match type means Exact": {
			cp: routed(func(r *coordinatorv1alpha1.RouteSpec) { r.EPPProfileMatch = "" }),
			check: func(g Gomega, r *gatewayv1.HTTPRoute) {
				g.Expect(r.Spec.Rules[0].Matches).To(HaveLen(3))
			},
		},
		"request timeout on both rules": {
			cp: routed(func(r *coordinatorv1alpha1.RouteSpec) { r.RequestTimeout = "10m" }),
			check: func(g Gomega, r *gatewayv1.HTTPRoute) {
				for _, rule := range r.Spec.Rules {
					g.Expect(rule.Timeouts).To(Equal(&gatewayv1.HTTPRouteTimeouts{Request: ptr.To(gatewayv1.Duration("10m"))}))
				}
				g.Expect(r.Spec.Rules[0].Timeouts).NotTo(BeIdenticalTo(r.Spec.Rules[1].Timeouts))
			},
		},
		"explicit parentRef in the pipeline's namespace": {
			cp: routed(func(r *coordinatorv1alpha1.RouteSpec) {
				r.ParentRef = &coordinatorv1alpha1.RouteParentReference{Name: "local", SectionName: "web"}
			}),
			check: func(g Gomega, r *gatewayv1.HTTPRoute) {
				g.Expect(r.Spec.ParentRefs[0].Name).To(BeEquivalentTo("local"))
				g.Expect(r.Spec.ParentRefs[0].Namespace).To(BeNil())
				g.Expect(*r.Spec.ParentRefs[0].SectionName).To(BeEquivalentTo("web"))
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			r := desiredHTTPRoute(tc.cp)
			expectOwnedBy(g, r, tc.cp)
			tc.check(g, r)
		})
	}
}

func TestRouteAcceptance(t *testing.T) {
	parent, _ := routeParent(routed(nil))
	status := func(ref gatewayv1.ParentReference, conds ...metav1.Condition) gatewayv1.RouteParentStatus {
		return gatewayv1.RouteParentStatus{ParentRef: ref, ControllerName: "example.net/gateway", Conditions: conds}
	}
	cond := func(t gatewayv1.RouteConditionType, s metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: string(t), Status: s, Reason: reason, Message: "from the gateway"}
	}
	accepted := cond(gatewayv1.RouteConditionAccepted, metav1.ConditionTrue, "Accepted")
	resolved := cond(gatewayv1.RouteConditionResolvedRefs, metav1.ConditionTrue, "ResolvedRefs")
	// asWritten is the parent as a gateway controller typically echoes it (defaults dropped).
	asWritten := gatewayv1.ParentReference{Name: "gw", Namespace: ptr.To(gatewayv1.Namespace("infra"))}

	tests := map[string]struct {
		parents     []gatewayv1.RouteParentStatus
		wantStatus  metav1.ConditionStatus
		wantReason  coordinatorv1alpha1.ConditionReason
		wantMessage string
	}{
		"no status yet": {
			wantStatus: metav1.ConditionUnknown, wantReason: coordinatorv1alpha1.ReasonPending,
			wantMessage: "no gateway controller has reported on Gateway.gateway.networking.k8s.io infra/gw yet",
		},
		"only another parent reported": {
			parents:    []gatewayv1.RouteParentStatus{status(gatewayv1.ParentReference{Name: "other"}, accepted)},
			wantStatus: metav1.ConditionUnknown, wantReason: coordinatorv1alpha1.ReasonPending,
		},
		"another listener of the same Gateway is a different parent": {
			parents: []gatewayv1.RouteParentStatus{status(gatewayv1.ParentReference{Name: "gw", Namespace: ptr.To(gatewayv1.Namespace("infra")),
				SectionName: ptr.To(gatewayv1.SectionName("https"))}, accepted)},
			wantStatus: metav1.ConditionUnknown, wantReason: coordinatorv1alpha1.ReasonPending,
		},
		"accepted and resolved (defaults omitted in status)": {
			parents:    []gatewayv1.RouteParentStatus{status(asWritten, accepted, resolved)},
			wantStatus: metav1.ConditionTrue, wantReason: coordinatorv1alpha1.ReasonAccepted,
			wantMessage: "accepted by Gateway.gateway.networking.k8s.io infra/gw (example.net/gateway)",
		},
		"accepted, explicit defaults in status": {
			parents:    []gatewayv1.RouteParentStatus{status(parent, accepted)},
			wantStatus: metav1.ConditionTrue, wantReason: coordinatorv1alpha1.ReasonAccepted,
		},
		"rejected": {
			parents:    []gatewayv1.RouteParentStatus{status(asWritten, cond(gatewayv1.RouteConditionAccepted, metav1.ConditionFalse, "NotAllowedByListeners"))},
			wantStatus: metav1.ConditionFalse, wantReason: coordinatorv1alpha1.ReasonNotAccepted,
			wantMessage: "reports Accepted=False (NotAllowedByListeners): from the gateway",
		},
		"accepted but a backend does not resolve": {
			parents: []gatewayv1.RouteParentStatus{status(asWritten, accepted,
				cond(gatewayv1.RouteConditionResolvedRefs, metav1.ConditionFalse, "InvalidKind"))},
			wantStatus: metav1.ConditionFalse, wantReason: coordinatorv1alpha1.ReasonRefsNotResolved,
			wantMessage: "ResolvedRefs=False (InvalidKind)",
		},
		"Accepted Unknown counts as no report": {
			parents:    []gatewayv1.RouteParentStatus{status(asWritten, cond(gatewayv1.RouteConditionAccepted, metav1.ConditionUnknown, "Pending"))},
			wantStatus: metav1.ConditionUnknown, wantReason: coordinatorv1alpha1.ReasonPending,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			route := desiredHTTPRoute(routed(nil))
			route.Status.Parents = tc.parents
			a := routeAcceptance(route, parent)
			g.Expect(a.status).To(Equal(tc.wantStatus), a.message)
			g.Expect(a.reason).To(Equal(tc.wantReason), a.message)
			g.Expect(a.message).To(ContainSubstring(tc.wantMessage))
		})
	}
}

func TestDesiredPodDisruptionBudget(t *testing.T) {
	pct := intstr.FromString("50%")
	tests := map[string]struct {
		spec               coordinatorv1alpha1.DisruptionBudgetSpec
		wantMinAvailable   *intstr.IntOrString
		wantMaxUnavailable *intstr.IntOrString
		wantPolicy         *policyv1.UnhealthyPodEvictionPolicyType
	}{
		"empty: one pod at a time": {wantMaxUnavailable: ptr.To(intstr.FromInt32(1))},
		"minAvailable percentage":  {spec: coordinatorv1alpha1.DisruptionBudgetSpec{MinAvailable: &pct}, wantMinAvailable: &pct},
		"maxUnavailable number": {
			spec:               coordinatorv1alpha1.DisruptionBudgetSpec{MaxUnavailable: ptr.To(intstr.FromInt32(2))},
			wantMaxUnavailable: ptr.To(intstr.FromInt32(2)),
		},
		"unhealthy pods may always be evicted": {
			spec:               coordinatorv1alpha1.DisruptionBudgetSpec{UnhealthyPodEvictionPolicy: ptr.To(policyv1.AlwaysAllow)},
			wantMaxUnavailable: ptr.To(intstr.FromInt32(1)), wantPolicy: ptr.To(policyv1.AlwaysAllow),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline("ns", "cp", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.DisruptionBudget = &tc.spec })
			pdb := desiredPodDisruptionBudget(cp)
			expectOwnedBy(g, pdb, cp)
			g.Expect(pdb.Name).To(Equal("cp"))
			g.Expect(pdb.Spec.Selector.MatchLabels).To(Equal(selectorLabels(cp)))
			g.Expect(pdb.Spec.MinAvailable).To(Equal(tc.wantMinAvailable))
			g.Expect(pdb.Spec.MaxUnavailable).To(Equal(tc.wantMaxUnavailable))
			g.Expect(pdb.Spec.UnhealthyPodEvictionPolicy).To(Equal(tc.wantPolicy))
		})
	}
}

func TestDesiredNetworkPolicy(t *testing.T) {
	tcp, udp := ptr.To(corev1.ProtocolTCP), ptr.To(corev1.ProtocolUDP)
	named := func(name string) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: tcp, Port: ptr.To(intstr.FromString(name))}
	}
	port := func(p corev1.Protocol, n int32) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: ptr.To(p), Port: ptr.To(intstr.FromInt32(n))}
	}
	dns := networkingv1.NetworkPolicyEgressRule{Ports: []networkingv1.NetworkPolicyPort{{Protocol: udp, Port: ptr.To(intstr.FromInt32(53))}, port(corev1.ProtocolTCP, 53)}}
	gatewayNS := namespacePeer("infra")
	monitoring := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}
	renderSvc := networkingv1.NetworkPolicyEgressRule{
		To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "render"}}}},
		Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, 8000)},
	}
	cfgWith := func(address string, metricsPort int) *config.Config {
		cfg := config.Default()
		cfg.Gateway.Address, cfg.Server.MetricsPort = address, metricsPort
		return &cfg
	}

	tests := map[string]struct {
		spec  coordinatorv1alpha1.NetworkPolicySpec
		cfg   *config.Config
		check func(g Gomega, np *networkingv1.NetworkPolicy)
	}{
		"ingress only, by default: the API port from the gateway's namespace, metrics from the pipeline's, egress open": {
			spec: coordinatorv1alpha1.NetworkPolicySpec{Enabled: true},
			cfg:  cfgWith(testGateway, 9090),
			check: func(g Gomega, np *networkingv1.NetworkPolicy) {
				g.Expect(np.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{networkingv1.PolicyTypeIngress}))
				g.Expect(np.Spec.Ingress).To(Equal([]networkingv1.NetworkPolicyIngressRule{
					{From: []networkingv1.NetworkPolicyPeer{gatewayNS}, Ports: []networkingv1.NetworkPolicyPort{named("http")}},
					{From: []networkingv1.NetworkPolicyPeer{namespacePeer("ns")}, Ports: []networkingv1.NetworkPolicyPort{named("metrics")}},
				}))
				g.Expect(np.Spec.Egress).To(BeNil())
			},
		},
		"TLS: the API port is named https": {
			spec: coordinatorv1alpha1.NetworkPolicySpec{Enabled: true},
			cfg:  tlsConfig(),
			check: func(g Gomega, np *networkingv1.NetworkPolicy) {
				g.Expect(np.Spec.Ingress[0].Ports).To(Equal([]networkingv1.NetworkPolicyPort{named("https")}))
				g.Expect(np.Spec.Ingress[1].Ports).To(Equal([]networkingv1.NetworkPolicyPort{named("metrics")}))
			},
		},
		"metrics disabled in the configuration: no metrics rule": {
			spec: coordinatorv1alpha1.NetworkPolicySpec{Enabled: true, MetricsFrom: []networkingv1.NetworkPolicyPeer{monitoring}},
			cfg:  cfgWith(testGateway, 0),
			check: func(g Gomega, np *networkingv1.NetworkPolicy) {
				g.Expect(np.Spec.Ingress).To(HaveLen(1))
			},
		},
		"no configuration rendered yet: API port only": {
			spec: coordinatorv1alpha1.NetworkPolicySpec{Enabled: true},
			check: func(g Gomega, np *networkingv1.NetworkPolicy) {
				g.Expect(np.Spec.Ingress).To(HaveLen(1))
			},
		},
		"restricted sources": {
			spec: coordinatorv1alpha1.NetworkPolicySpec{Enabled: true, IngressFrom: []networkingv1.NetworkPolicyPeer{gatewayNS}, MetricsFrom: []networkingv1.NetworkPolicyPeer{monitoring}},
			cfg:  cfgWith(testGateway, 9090),
			check: func(g Gomega, np *networkingv1.NetworkPolicy) {
				g.Expect(np.Spec.Ingress[0].From).To(Equal([]networkingv1.NetworkPolicyPeer{gatewayNS}))
				g.Expect(np.Spec.Ingress[1].From).To(Equal([]networkingv1.NetworkPolicyPeer{monitoring}))
			},
		},
		"egress: DNS, the gateway address's port, additional rules": {
			spec: coordinatorv1alpha1.NetworkPolicySpec{Enabled: true, Egress: &coordinatorv1alpha1.NetworkPolicyEgress{
				GatewayTo: []networkingv1.NetworkPolicyPeer{gatewayNS}, Additional: []networkingv1.NetworkPolicyEgressRule{renderSvc},
			}},
			cfg: cfgWith("http://inference-gateway.infra.svc:8081", 9090),
			check: func(g Gomega, np *networkingv1.NetworkPolicy) {
				g.Expect(np.Spec.PolicyTypes).To(Equal([]networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}))
				g.Expect(np.Spec.Egress).To(Equal([]networkingv1.NetworkPolicyEgressRule{
					dns,
					{To: []networkingv1.NetworkPolicyPeer{gatewayNS}, Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, 8081)}},
					renderSvc,
				}))
			},
		},
		"egress: scheme default port, any destination": {
			spec: coordinatorv1alpha1.NetworkPolicySpec{Enabled: true, Egress: &coordinatorv1alpha1.NetworkPolicyEgress{}},
			cfg:  cfgWith("https://gateway.example.com", 9090),
			check: func(g Gomega, np *networkingv1.NetworkPolicy) {
				g.Expect(np.Spec.Egress).To(Equal([]networkingv1.NetworkPolicyEgressRule{dns, {Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, 443)}}}))
			},
		},
		"egress: gatewayPorts override the address's port": {
			spec: coordinatorv1alpha1.NetworkPolicySpec{Enabled: true, Egress: &coordinatorv1alpha1.NetworkPolicyEgress{GatewayPorts: []int32{10080, 10443}}},
			cfg:  cfgWith(testGateway, 9090),
			check: func(g Gomega, np *networkingv1.NetworkPolicy) {
				g.Expect(np.Spec.Egress[1].Ports).To(Equal([]networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, 10080), port(corev1.ProtocolTCP, 10443)}))
			},
		},
		"egress without a configuration or gatewayPorts: DNS only": {
			spec: coordinatorv1alpha1.NetworkPolicySpec{Enabled: true, Egress: &coordinatorv1alpha1.NetworkPolicyEgress{}},
			check: func(g Gomega, np *networkingv1.NetworkPolicy) {
				g.Expect(np.Spec.Egress).To(Equal([]networkingv1.NetworkPolicyEgressRule{dns}))
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline("ns", "cp", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.NetworkPolicy = &tc.spec })
			np := desiredNetworkPolicy(cp, tc.cfg, "")
			expectOwnedBy(g, np, cp)
			g.Expect(np.Name).To(Equal("cp"))
			g.Expect(np.Spec.PodSelector.MatchLabels).To(Equal(selectorLabels(cp)))
			tc.check(g, np)
		})
	}
}

func TestAddressPort(t *testing.T) {
	tests := map[string]struct {
		address string
		want    int32
		wantOK  bool
	}{
		"explicit port":      {"http://gw.infra.svc:8081", 8081, true},
		"http default":       {"http://gw.infra.svc", 80, true},
		"https default":      {"https://gw.example.com", 443, true},
		"IPv6 with port":     {"http://[fd00::1]:8080", 8080, true},
		"not a URL":          {"gw:80", 0, false},
		"unsupported scheme": {"grpc://gw", 0, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := addressPort(tc.address)
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("addressPort(%q) = %d, %v; want %d, %v", tc.address, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func namespacePeer(ns string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}
}

// Without ingressFrom, only the gateway's namespaces reach the API port: the Gateway the route
// attaches to, the referenced Gateway, or the namespace of a Service DNS name in the address;
// when none can be derived, only the pipeline's own namespace.
func TestNetworkPolicyDefaultIngressIsTheGatewayNamespace(t *testing.T) {
	tests := map[string]struct {
		gateway coordinatorv1alpha1.GatewaySpec
		route   *coordinatorv1alpha1.RouteSpec
		want    []string
	}{
		"gatewayRef in another namespace": {
			gateway: coordinatorv1alpha1.GatewaySpec{GatewayRef: &coordinatorv1alpha1.GatewayReference{Name: "gw", Namespace: "infra"}},
			want:    []string{"infra"},
		},
		"gatewayRef in the pipeline's namespace": {
			gateway: coordinatorv1alpha1.GatewaySpec{GatewayRef: &coordinatorv1alpha1.GatewayReference{Name: "gw"}},
			want:    []string{"ns"},
		},
		"route parent and gatewayRef in different namespaces": {
			gateway: coordinatorv1alpha1.GatewaySpec{GatewayRef: &coordinatorv1alpha1.GatewayReference{Name: "gw", Namespace: "infra"}},
			route:   &coordinatorv1alpha1.RouteSpec{ParentRef: &coordinatorv1alpha1.RouteParentReference{Name: "edge", Namespace: "edge"}},
			want:    []string{"edge", "infra"},
		},
		"route parent with an address": {
			gateway: coordinatorv1alpha1.GatewaySpec{Address: "http://10.0.0.1"},
			route:   &coordinatorv1alpha1.RouteSpec{ParentRef: &coordinatorv1alpha1.RouteParentReference{Name: "gw"}},
			want:    []string{"ns"},
		},
		"address: service.namespace.svc.cluster.local": {
			gateway: coordinatorv1alpha1.GatewaySpec{Address: "http://inference-gateway.llm-d.svc.cluster.local:80"},
			want:    []string{"llm-d"},
		},
		"address: service.namespace.svc, custom cluster domain": {
			gateway: coordinatorv1alpha1.GatewaySpec{Address: "http://gw.infra.svc.k8s.example.:80"},
			want:    []string{"infra"},
		},
		"address: service.namespace": {
			gateway: coordinatorv1alpha1.GatewaySpec{Address: "https://gw.infra"},
			want:    []string{"infra"},
		},
		"address: a bare service": {
			gateway: coordinatorv1alpha1.GatewaySpec{Address: "http://inference-gateway:80"},
			want:    []string{"ns"},
		},
		"address: an IP, the pipeline's namespace only": {
			gateway: coordinatorv1alpha1.GatewaySpec{Address: "http://10.96.0.10:80"},
			want:    []string{"ns"},
		},
		"address: an external host, the pipeline's namespace only": {
			gateway: coordinatorv1alpha1.GatewaySpec{Address: "https://gateway.example.com"},
			want:    []string{"ns"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline("ns", "cp", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Gateway, cp.Spec.Route = tc.gateway, tc.route
				cp.Spec.NetworkPolicy = &coordinatorv1alpha1.NetworkPolicySpec{Enabled: true}
			})
			want := make([]networkingv1.NetworkPolicyPeer, len(tc.want))
			for i, ns := range tc.want {
				want[i] = namespacePeer(ns)
			}
			cfg := config.Default()
			np := desiredNetworkPolicy(cp, &cfg, "")
			g.Expect(np.Spec.Ingress[0].From).To(Equal(want))
			g.Expect(np.Spec.Ingress[1].From).To(Equal([]networkingv1.NetworkPolicyPeer{namespacePeer("ns")}), "metrics: the pipeline's namespace")
		})
	}
}

// The operator's namespace reaches the admin port (the rollout probe asks it) whatever
// metricsFrom says, and is not listed twice.
func TestNetworkPolicyAdmitsTheRolloutProbe(t *testing.T) {
	peer := func(ns string) networkingv1.NetworkPolicyPeer { return namespacePeers([]string{ns})[0] }
	custom := []networkingv1.NetworkPolicyPeer{peer("monitoring")}
	tests := map[string]struct {
		metricsFrom []networkingv1.NetworkPolicyPeer
		operatorNS  string
		want        []networkingv1.NetworkPolicyPeer
	}{
		"operator elsewhere":             {operatorNS: "coordinator-system", want: []networkingv1.NetworkPolicyPeer{peer("ns"), peer("coordinator-system")}},
		"operator in the same namespace": {operatorNS: "ns", want: []networkingv1.NetworkPolicyPeer{peer("ns")}},
		"custom metricsFrom":             {metricsFrom: custom, operatorNS: "coordinator-system", want: []networkingv1.NetworkPolicyPeer{peer("monitoring"), peer("coordinator-system")}},
		"operator namespace unknown":     {metricsFrom: custom, want: custom},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline("ns", "cp", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.NetworkPolicy = &coordinatorv1alpha1.NetworkPolicySpec{Enabled: true, MetricsFrom: tc.metricsFrom}
			})
			cfg := config.Default()
			cfg.Gateway.Address, cfg.Server.MetricsPort = testGateway, 9090
			np := desiredNetworkPolicy(cp, &cfg, tc.operatorNS)
			g.Expect(np.Spec.Ingress).To(HaveLen(2))
			g.Expect(np.Spec.Ingress[1].From).To(Equal(tc.want))
		})
	}
}
