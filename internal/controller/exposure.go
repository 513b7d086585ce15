package controller

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// The optional children that expose and protect the coordinators: an HTTPRoute (spec.route), a
// PodDisruptionBudget (spec.disruptionBudget) and a NetworkPolicy (spec.networkPolicy). All are
// named like the CoordinatorPipeline.

// Rule names of the HTTPRoute.
const (
	routeRuleWorkers     = "epp-profile"
	routeRuleCoordinator = "coordinator"
)

// eppProfiles are the EPP-Profile values the coordinator sends on its legs.
var eppProfiles = []string{gateway.ProfileEncode, gateway.ProfilePrefill, gateway.ProfileDecode}

// routeParent is the Gateway the HTTPRoute attaches to: spec.route.parentRef, else
// spec.gateway.gatewayRef. ok is false when neither is set (the CRD's validation prevents it).
func routeParent(cp *coordinatorv1alpha1.CoordinatorPipeline) (ref gatewayv1.ParentReference, ok bool) {
	var name, namespace, section string
	switch {
	case cp.Spec.Route != nil && cp.Spec.Route.ParentRef != nil:
		p := cp.Spec.Route.ParentRef
		name, namespace, section = p.Name, p.Namespace, p.SectionName
	case cp.Spec.Gateway.GatewayRef != nil:
		g := cp.Spec.Gateway.GatewayRef
		name, namespace, section = g.Name, g.Namespace, g.SectionName
	default:
		return gatewayv1.ParentReference{}, false
	}
	ref = gatewayv1.ParentReference{
		Group: ptr.To(gatewayv1.Group(gatewayv1.GroupName)),
		Kind:  ptr.To(gatewayv1.Kind("Gateway")),
		Name:  gatewayv1.ObjectName(name),
	}
	if namespace != "" && namespace != cp.Namespace {
		ref.Namespace = ptr.To(gatewayv1.Namespace(namespace))
	}
	if section != "" {
		ref.SectionName = ptr.To(gatewayv1.SectionName(section))
	}
	return ref, true
}

// desiredHTTPRoute attaches cp to its Gateway with two rules: requests carrying the profile
// header (the first of gateway.profile_headers: the coordinator's legs) go to the InferencePool, everything else to the coordinator
// Service. Both rules match every path; the header rule wins by Gateway API precedence (more
// header matches). The caller checks routeParent first.
func desiredHTTPRoute(cp *coordinatorv1alpha1.CoordinatorPipeline) *gatewayv1.HTTPRoute {
	spec := cp.Spec.Route
	parent, _ := routeParent(cp)
	everyPath := &gatewayv1.HTTPPathMatch{Type: ptr.To(gatewayv1.PathMatchPathPrefix), Value: ptr.To("/")}

	// Every leg carries its profile under each of gateway.profile_headers: the rule matches the first.
	header := gatewayv1.HTTPHeaderName(config.DefaultProfileHeaders()[0])
	if names := cp.Spec.Gateway.ProfileHeaders; len(names) > 0 {
		header = gatewayv1.HTTPHeaderName(names[0])
	}
	var legMatches []gatewayv1.HTTPRouteMatch
	if spec.EPPProfileMatch == coordinatorv1alpha1.EPPProfileMatchRegularExpression {
		legMatches = []gatewayv1.HTTPRouteMatch{{Path: everyPath, Headers: []gatewayv1.HTTPHeaderMatch{{
			Type: ptr.To(gatewayv1.HeaderMatchRegularExpression), Name: header, Value: ".+",
		}}}}
	} else {
		for _, profile := range eppProfiles {
			legMatches = append(legMatches, gatewayv1.HTTPRouteMatch{Path: everyPath, Headers: []gatewayv1.HTTPHeaderMatch{{
				Type: ptr.To(gatewayv1.HeaderMatchExact), Name: header, Value: profile,
			}}})
		}
	}
	var timeouts *gatewayv1.HTTPRouteTimeouts
	if spec.RequestTimeout != "" {
		timeouts = &gatewayv1.HTTPRouteTimeouts{Request: ptr.To(gatewayv1.Duration(spec.RequestTimeout))}
	}

	return &gatewayv1.HTTPRoute{
		ObjectMeta: childMeta(cp, cp.Name),
		Spec: gatewayv1.HTTPRouteSpec{
			CommonRouteSpec: gatewayv1.CommonRouteSpec{ParentRefs: []gatewayv1.ParentReference{parent}},
			Rules: []gatewayv1.HTTPRouteRule{
				{
					Name:    ptr.To(gatewayv1.SectionName(routeRuleWorkers)),
					Matches: legMatches,
					BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
						BackendObjectReference: gatewayv1.BackendObjectReference{
							Group: ptr.To(gatewayv1.Group(infv1.GroupVersion.Group)),
							Kind:  ptr.To(gatewayv1.Kind("InferencePool")),
							Name:  gatewayv1.ObjectName(cp.Spec.InferencePoolRef.Name),
						},
						Weight: ptr.To[int32](1),
					}}},
					Timeouts: timeouts,
				},
				{
					Name:    ptr.To(gatewayv1.SectionName(routeRuleCoordinator)),
					Matches: []gatewayv1.HTTPRouteMatch{{Path: everyPath}},
					BackendRefs: []gatewayv1.HTTPBackendRef{{BackendRef: gatewayv1.BackendRef{
						BackendObjectReference: gatewayv1.BackendObjectReference{
							Group: ptr.To(gatewayv1.Group("")),
							Kind:  ptr.To(gatewayv1.Kind("Service")),
							Name:  gatewayv1.ObjectName(cp.Name),
							Port:  ptr.To(gatewayv1.PortNumber(ListenPort)),
						},
						Weight: ptr.To[int32](1),
					}}},
					Timeouts: timeouts.DeepCopy(),
				},
			},
		},
	}
}

// acceptance is the RouteAccepted condition computed from an HTTPRoute's status.
type acceptance struct {
	status  metav1.ConditionStatus
	reason  coordinatorv1alpha1.ConditionReason
	message string
}

// routeAcceptance reads the status the gateway controller wrote for parent on route: True when
// it reports Accepted=True and no ResolvedRefs=False, False (with the gateway's reason and
// message) when it reports either as False, Unknown while no controller has reported.
func routeAcceptance(route *gatewayv1.HTTPRoute, parent gatewayv1.ParentReference) acceptance {
	who := parentKey(route.Namespace, parent)
	for _, ps := range route.Status.Parents {
		if parentKey(route.Namespace, ps.ParentRef) != who {
			continue
		}
		accepted := meta.FindStatusCondition(ps.Conditions, string(gatewayv1.RouteConditionAccepted))
		if accepted == nil || accepted.Status == metav1.ConditionUnknown {
			continue
		}
		if accepted.Status == metav1.ConditionFalse {
			return acceptance{metav1.ConditionFalse, coordinatorv1alpha1.ReasonNotAccepted,
				fmt.Sprintf("HTTPRoute %s: %s (%s) reports Accepted=False (%s): %s", route.Name, who, ps.ControllerName, accepted.Reason, accepted.Message)}
		}
		if c := meta.FindStatusCondition(ps.Conditions, string(gatewayv1.RouteConditionResolvedRefs)); c != nil && c.Status == metav1.ConditionFalse {
			return acceptance{metav1.ConditionFalse, coordinatorv1alpha1.ReasonRefsNotResolved,
				fmt.Sprintf("HTTPRoute %s: %s (%s) reports ResolvedRefs=False (%s): %s", route.Name, who, ps.ControllerName, c.Reason, c.Message)}
		}
		return acceptance{metav1.ConditionTrue, coordinatorv1alpha1.ReasonAccepted,
			fmt.Sprintf("HTTPRoute %s accepted by %s (%s)", route.Name, who, ps.ControllerName)}
	}
	return acceptance{metav1.ConditionUnknown, coordinatorv1alpha1.ReasonPending,
		fmt.Sprintf("HTTPRoute %s: no gateway controller has reported on %s yet", route.Name, who)}
}

// parentKey renders a parent reference with the Gateway API defaults filled in (group
// gateway.networking.k8s.io, kind Gateway, the route's namespace), for comparing a status entry
// with the spec's reference.
func parentKey(routeNamespace string, ref gatewayv1.ParentReference) string {
	group, kind, ns := gatewayv1.GroupName, "Gateway", routeNamespace
	if ref.Group != nil && *ref.Group != "" {
		group = string(*ref.Group)
	}
	if ref.Kind != nil && *ref.Kind != "" {
		kind = string(*ref.Kind)
	}
	if ref.Namespace != nil && *ref.Namespace != "" {
		ns = string(*ref.Namespace)
	}
	key := fmt.Sprintf("%s.%s %s/%s", kind, group, ns, ref.Name)
	if ref.SectionName != nil && *ref.SectionName != "" {
		key += " section " + string(*ref.SectionName)
	}
	if ref.Port != nil {
		key += " port " + strconv.Itoa(int(*ref.Port))
	}
	return key
}

// desiredPodDisruptionBudget limits voluntary evictions of cp's coordinator pods. Without
// minAvailable or maxUnavailable it allows one pod down at a time.
func desiredPodDisruptionBudget(cp *coordinatorv1alpha1.CoordinatorPipeline) *policyv1.PodDisruptionBudget {
	spec := cp.Spec.DisruptionBudget
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: childMeta(cp, cp.Name),
		Spec: policyv1.PodDisruptionBudgetSpec{
			Selector:                   &metav1.LabelSelector{MatchLabels: selectorLabels(cp)},
			UnhealthyPodEvictionPolicy: spec.UnhealthyPodEvictionPolicy,
		},
	}
	switch {
	case spec.MinAvailable != nil:
		pdb.Spec.MinAvailable = ptr.To(*spec.MinAvailable)
	case spec.MaxUnavailable != nil:
		pdb.Spec.MaxUnavailable = ptr.To(*spec.MaxUnavailable)
	default:
		pdb.Spec.MaxUnavailable = ptr.To(intstr.FromInt32(1))
	}
	return pdb
}

// networkPolicyEnabled reports whether cp asks for a NetworkPolicy.
func networkPolicyEnabled(cp *coordinatorv1alpha1.CoordinatorPipeline) bool {
	return cp.Spec.NetworkPolicy != nil && cp.Spec.NetworkPolicy.Enabled
}

// desiredNetworkPolicy selects cp's coordinator pods. Ingress: the API port from
// spec.networkPolicy.ingressFrom (by default the gateway's namespaces, ingressDefaultPeers) and,
// when cfg enables metrics, the metrics and admin port from metricsFrom (by default cp's own
// namespace) and from operatorNamespace (the operator's rollout probe asks that port; "" when
// unknown). Egress, only with spec.networkPolicy.egress: DNS, the gateway ports towards
// gatewayTo, and the additional rules. cfg is the applied configuration (nil when none was
// rendered yet: no metrics rule, and the gateway port is only known from gatewayPorts); it also
// names the API port (http, or https with TLS).
func desiredNetworkPolicy(cp *coordinatorv1alpha1.CoordinatorPipeline, cfg *config.Config, operatorNamespace string) *networkingv1.NetworkPolicy {
	spec := cp.Spec.NetworkPolicy
	tcp := ptr.To(corev1.ProtocolTCP)
	ingressFrom := deepCopyPeers(spec.IngressFrom)
	if len(ingressFrom) == 0 {
		ingressFrom = namespacePeers(gatewayNamespaces(cp))
	}
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: childMeta(cp, cp.Name),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: selectorLabels(cp)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  ingressFrom,
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: tcp, Port: ptr.To(intstr.FromString(servingPortName(cfg)))}},
			}},
		},
	}
	if cfg != nil && cfg.Server.MetricsPort > 0 {
		metricsFrom := deepCopyPeers(spec.MetricsFrom)
		if len(metricsFrom) == 0 {
			metricsFrom = namespacePeers([]string{cp.Namespace})
		}
		if operatorNamespace != "" && (len(spec.MetricsFrom) > 0 || operatorNamespace != cp.Namespace) {
			metricsFrom = append(metricsFrom, namespacePeers([]string{operatorNamespace})...)
		}
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{
			From:  metricsFrom,
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: tcp, Port: ptr.To(intstr.FromString(metricsPortName))}},
		})
	}
	if spec.Egress == nil {
		return np
	}

	np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
	np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
		Ports: []networkingv1.NetworkPolicyPort{
			{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))},
			{Protocol: tcp, Port: ptr.To(intstr.FromInt32(53))},
		},
	}}
	ports := spec.Egress.GatewayPorts
	if len(ports) == 0 && cfg != nil {
		if p, ok := addressPort(cfg.Gateway.Address); ok {
			ports = []int32{p}
		}
	}
	if len(ports) > 0 {
		rule := networkingv1.NetworkPolicyEgressRule{To: deepCopyPeers(spec.Egress.GatewayTo)}
		for _, p := range ports {
			rule.Ports = append(rule.Ports, networkingv1.NetworkPolicyPort{Protocol: tcp, Port: ptr.To(intstr.FromInt32(p))})
		}
		np.Spec.Egress = append(np.Spec.Egress, rule)
	}
	for i := range spec.Egress.Additional {
		np.Spec.Egress = append(np.Spec.Egress, *spec.Egress.Additional[i].DeepCopy())
	}
	return np
}

// addressPort is the TCP port of a gateway base URL: its explicit port, else 80 for http and
// 443 for https.
func addressPort(address string) (int32, bool) {
	u, err := url.Parse(address)
	if err != nil || u.Host == "" {
		return 0, false
	}
	if _, p, err := net.SplitHostPort(u.Host); err == nil {
		n, err := strconv.ParseInt(p, 10, 32)
		return int32(n), err == nil && n > 0 && n <= 65535
	}
	switch u.Scheme {
	case "http":
		return 80, true
	case "https":
		return 443, true
	}
	return 0, false
}

// namespaceLabel is the label the API server puts on every namespace, its name
// (kubernetes.io/metadata.name).
const namespaceLabel = corev1.LabelMetadataName

// gatewayNamespaces are the namespaces the gateway's traffic to cp's API port comes from, sorted
// and without duplicates: the namespace of the Gateway the HTTPRoute attaches to (with
// spec.route), of spec.gateway.gatewayRef, or the Service namespace in spec.gateway.address
// (serviceNamespace). Without any, cp's own namespace.
func gatewayNamespaces(cp *coordinatorv1alpha1.CoordinatorPipeline) []string {
	orDefault := func(ns string) string {
		if ns == "" {
			return cp.Namespace
		}
		return ns
	}
	var out []string
	if cp.Spec.Route != nil {
		if p := cp.Spec.Route.ParentRef; p != nil {
			out = append(out, orDefault(p.Namespace))
		}
	}
	if g := cp.Spec.Gateway.GatewayRef; g != nil {
		out = append(out, orDefault(g.Namespace))
	}
	if ns, ok := serviceNamespace(cp.Spec.Gateway.Address, cp.Namespace); ok {
		out = append(out, ns)
	}
	if len(out) == 0 {
		out = []string{cp.Namespace}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// serviceNamespace is the namespace of a gateway base URL whose host is a Kubernetes Service DNS
// name: <service> (namespace defaultNS), <service>.<namespace>, or
// <service>.<namespace>.svc[.<cluster domain>]. ok is false for an IP address, another host name
// (e.g. gateway.example.com) or an unparsable address.
func serviceNamespace(address, defaultNS string) (string, bool) {
	u, err := url.Parse(address)
	if err != nil {
		return "", false
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if host == "" || net.ParseIP(host) != nil {
		return "", false
	}
	labels := strings.Split(host, ".")
	var ns string
	switch {
	case len(labels) == 1:
		ns = defaultNS
	case len(labels) == 2, labels[2] == "svc":
		ns = labels[1]
	default:
		return "", false
	}
	if len(validation.IsDNS1123Label(labels[0])) > 0 || len(validation.IsDNS1123Label(ns)) > 0 {
		return "", false
	}
	return ns, true
}

// namespacePeers selects every pod of each namespace.
func namespacePeers(namespaces []string) []networkingv1.NetworkPolicyPeer {
	out := make([]networkingv1.NetworkPolicyPeer, len(namespaces))
	for i, ns := range namespaces {
		out[i] = networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{namespaceLabel: ns}}}
	}
	return out
}

func deepCopyPeers(in []networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer {
	if in == nil {
		return nil
	}
	out := make([]networkingv1.NetworkPolicyPeer, len(in))
	for i := range in {
		in[i].DeepCopyInto(&out[i])
	}
	return out
}
