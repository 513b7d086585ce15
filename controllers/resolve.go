package controllers

import (
	"fmt"
	"net"
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

// explicitGateway is the resolution of spec.gateway.address.
func explicitGateway(address string) resolution {
	return resolution{ok: true, reason: coordinatorv1alpha1.ReasonAddressSet, address: address,
		message: fmt.Sprintf("gateway address %s set in spec.gateway.address", address)}
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
