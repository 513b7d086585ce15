package controller

import (
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// resolution is what resolving a reference (the InferencePool, the gateway) found: the
// condition it maps to and, for the gateway, the address.
type resolution struct {
	// ok is the condition status (True when ok).
	ok bool
	// reason and message of the condition.
	reason  coordinatorv1alpha1.ConditionReason
	message string
	// address is the gateway base URL (gateway resolutions only).
	address string
}

// explicitGateway is the resolution of spec.gateway.address. The CRD's CEL rules refuse the hosts
// checkGatewayHost refuses; the check is repeated here for objects stored before those rules.
func explicitGateway(address string) resolution {
	if err := checkGatewayHost(addressHost(address)); err != nil {
		return resolution{reason: coordinatorv1alpha1.ReasonAddressNotAllowed,
			message: fmt.Sprintf("spec.gateway.address: %v; the configuration is not applied", err)}
	}
	return resolution{ok: true, reason: coordinatorv1alpha1.ReasonAddressSet, address: address,
		message: fmt.Sprintf("gateway address %s set in spec.gateway.address", address)}
}

// addressHost is the host of a gateway base URL as the CRD's CEL rules read it from the raw
// string: the authority after "//" without the port, and without the brackets of an IPv6
// address; user information or percent-encoding stay in (and make checkGatewayHost refuse it).
func addressHost(address string) string {
	_, a, ok := strings.Cut(address, "//")
	if !ok {
		return ""
	}
	if i := strings.IndexAny(a, "/?#"); i >= 0 {
		a = a[:i]
	}
	if strings.HasPrefix(a, "[") {
		if i := strings.Index(a, "]"); i >= 0 {
			return a[1:i]
		}
	}
	host, _, _ := strings.Cut(a, ":")
	return host
}

// Hosts a gateway address must not name: the coordinator forwards client requests (headers
// included) to the gateway, so an address at the pod itself or at a cloud instance metadata
// service would turn it into a proxy to them. The CRD's CEL rules on spec.gateway.address refuse
// the same, with the same reasons.
var (
	dnsName          = regexp.MustCompile(`^[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?([.][a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?)*[.]?$`)
	nonCanonicalIPv4 = regexp.MustCompile(`^(0[xX][0-9a-fA-F]*|[0-9]+)([.](0[xX][0-9a-fA-F]*|[0-9]+))*[.]?$`)
	thisNetwork      = netip.MustParsePrefix("0.0.0.0/8")
	metadataAddrs    = []netip.Addr{netip.MustParseAddr("100.100.100.200"), netip.MustParseAddr("fd00:ec2::254")}
	metadataNames    = []string{"metadata", "metadata.google.internal"}
)

// checkGatewayHost refuses a gateway host that is unspecified, link-local or a cloud instance
// metadata service, or that is neither a DNS name nor an IP address in
// canonical form (a zone, an IPv4-mapped IPv6 address, octal or hexadecimal IPv4, user
// information, percent-encoding), naming the reason.
func checkGatewayHost(host string) error {
	addr, err := netip.ParseAddr(host)
	if err != nil || addr.Zone() != "" || addr.Is4In6() {
		if !dnsName.MatchString(host) || nonCanonicalIPv4.MatchString(host) {
			return fmt.Errorf("host %q must be a DNS name or an IP address in canonical form (dotted-decimal IPv4, IPv6 without a zone or an IPv4-mapped form), without user information or percent-encoding", host)
		}
		name := strings.TrimSuffix(strings.ToLower(host), ".")
		if slices.Contains(metadataNames, name) {
			return fmt.Errorf("host %s must not be a cloud instance metadata service name (metadata, metadata.google.internal)", host)
		}
		return nil
	}
	switch {
	case addr.IsUnspecified() || thisNetwork.Contains(addr):
		return fmt.Errorf("host %s must not be an unspecified address (0.0.0.0/8, ::)", host)
	case addr.IsLinkLocalUnicast():
		return fmt.Errorf("host %s must not be link-local (169.254.0.0/16, fe80::/10): cloud instance metadata services listen there", host)
	case slices.Contains(metadataAddrs, addr):
		return fmt.Errorf("host %s must not be a cloud instance metadata service (100.100.100.200, fd00:ec2::254)", host)
	}
	return nil
}

// resolveGatewayAddress derives the gateway base URL from a Gateway's status and listeners:
// the first Hostname or IPAddress status address, the listener named by ref.sectionName (or the
// first HTTP/HTTPS listener) for the scheme, and ref.port or the listener's port.
func resolveGatewayAddress(gw *gatewayv1.Gateway, ref coordinatorv1alpha1.GatewayReference) resolution {
	key := gw.Namespace + "/" + gw.Name
	var listener *gatewayv1.Listener
	for i := range gw.Spec.Listeners {
		l := &gw.Spec.Listeners[i]
		if ref.SectionName != "" && string(l.Name) != ref.SectionName {
			continue
		}
		if l.Protocol == gatewayv1.HTTPProtocolType || l.Protocol == gatewayv1.HTTPSProtocolType {
			listener = l
			break
		}
	}
	if listener == nil {
		msg := fmt.Sprintf("Gateway %s has no HTTP or HTTPS listener", key)
		if ref.SectionName != "" {
			msg = fmt.Sprintf("Gateway %s has no HTTP or HTTPS listener named %q", key, ref.SectionName)
		}
		return resolution{reason: coordinatorv1alpha1.ReasonListenerNotFound, message: msg}
	}
	host := ""
	for _, a := range gw.Status.Addresses {
		if a.Value == "" {
			continue
		}
		if a.Type == nil || *a.Type == gatewayv1.IPAddressType || *a.Type == gatewayv1.HostnameAddressType {
			host = a.Value
			break
		}
	}
	if host == "" {
		return resolution{reason: coordinatorv1alpha1.ReasonAddressPending,
			message: fmt.Sprintf("Gateway %s has no IPAddress or Hostname in status.addresses yet", key)}
	}
	if err := checkGatewayHost(host); err != nil {
		return resolution{reason: coordinatorv1alpha1.ReasonAddressNotAllowed,
			message: fmt.Sprintf("Gateway %s status address: %v; the configuration is not applied", key, err)}
	}
	scheme := "http"
	if listener.Protocol == gatewayv1.HTTPSProtocolType {
		scheme = "https"
	}
	port := listener.Port
	if ref.Port != nil {
		port = *ref.Port
	}
	address := scheme + "://" + net.JoinHostPort(host, strconv.Itoa(int(port)))
	return resolution{ok: true, reason: coordinatorv1alpha1.ReasonResolved, address: address,
		message: fmt.Sprintf("gateway address %s from Gateway %s listener %s", address, key, listener.Name)}
}

// summarizePool maps an InferencePool to the InferencePoolResolved condition: True unless one of
// its parents (the Gateways that reference it) reports Accepted=False or ResolvedRefs=False, in
// which case the parent's reason and message are carried over.
func summarizePool(pool *infv1.InferencePool) resolution {
	var accepted []string
	for _, parent := range pool.Status.Parents {
		who := parentName(pool, parent.ParentRef)
		for _, check := range []struct {
			condType string
			reason   coordinatorv1alpha1.ConditionReason
		}{
			{string(infv1.InferencePoolConditionAccepted), coordinatorv1alpha1.ReasonNotAccepted},
			{string(infv1.InferencePoolConditionResolvedRefs), coordinatorv1alpha1.ReasonRefsNotResolved},
		} {
			c := meta.FindStatusCondition(parent.Conditions, check.condType)
			if c != nil && c.Status == metav1.ConditionFalse {
				return resolution{reason: check.reason, message: fmt.Sprintf("InferencePool %s: parent %s reports %s=False (%s): %s",
					pool.Name, who, c.Type, c.Reason, c.Message)}
			}
		}
		if meta.IsStatusConditionTrue(parent.Conditions, string(infv1.InferencePoolConditionAccepted)) {
			accepted = append(accepted, who)
		}
	}
	msg := fmt.Sprintf("InferencePool %s found; no parent has reported status yet", pool.Name)
	if len(accepted) > 0 {
		msg = fmt.Sprintf("InferencePool %s accepted by %s", pool.Name, strings.Join(accepted, ", "))
	}
	return resolution{ok: true, reason: coordinatorv1alpha1.ReasonResolved, message: msg}
}

// parentName renders a pool parent as Kind namespace/name (Gateway and the pool's namespace by
// default).
func parentName(pool *infv1.InferencePool, ref infv1.ParentReference) string {
	kind, ns := string(ref.Kind), string(ref.Namespace)
	if kind == "" {
		kind = "Gateway"
	}
	if ns == "" {
		ns = pool.Namespace
	}
	return fmt.Sprintf("%s %s/%s", kind, ns, ref.Name)
}

// missingPool is the resolution of an InferencePool that does not exist.
func missingPool(namespace, name string) resolution {
	return resolution{reason: coordinatorv1alpha1.ReasonNotFound,
		message: fmt.Sprintf("InferencePool %s not found in namespace %s", name, namespace)}
}

// missingGateway is the resolution of a Gateway that does not exist.
func missingGateway(namespace, name string) resolution {
	return resolution{reason: coordinatorv1alpha1.ReasonNotFound,
		message: fmt.Sprintf("Gateway %s/%s not found", namespace, name)}
}

// apiUnavailable is the resolution of a reference whose CRD is not installed.
func apiUnavailable(kind, group string) resolution {
	return resolution{reason: coordinatorv1alpha1.ReasonAPIUnavailable,
		message: fmt.Sprintf("the %s API (%s) is not installed in the cluster, or was not when the operator started", kind, group)}
}
