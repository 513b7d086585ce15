package controllers

import (
	"testing"

	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	infv1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

func TestResolveGatewayAddress(t *testing.T) {
	ip, hostname, named := gatewayv1.IPAddressType, gatewayv1.HostnameAddressType, gatewayv1.AddressType("example.com/named")
	gateway := func(listeners []gatewayv1.Listener, addrs ...gatewayv1.GatewayStatusAddress) *gatewayv1.Gateway {
		return &gatewayv1.Gateway{
			ObjectMeta: metav1.ObjectMeta{Namespace: "infra", Name: "gw"},
			Spec:       gatewayv1.GatewaySpec{Listeners: listeners},
			Status:     gatewayv1.GatewayStatus{Addresses: addrs},
		}
	}
	httpL := gatewayv1.Listener{Name: "http", Protocol: gatewayv1.HTTPProtocolType, Port: 80}
	httpsL := gatewayv1.Listener{Name: "https", Protocol: gatewayv1.HTTPSProtocolType, Port: 443}
	tcpL := gatewayv1.Listener{Name: "tcp", Protocol: gatewayv1.TCPProtocolType, Port: 9000}

	tests := map[string]struct {
		gw          *gatewayv1.Gateway
		ref         coordinatorv1alpha1.GatewayReference
		wantAddress string
		wantReason  coordinatorv1alpha1.ConditionReason
	}{
		"first http listener and IP": {
			gw:          gateway([]gatewayv1.Listener{tcpL, httpL, httpsL}, gatewayv1.GatewayStatusAddress{Type: &ip, Value: "10.0.0.7"}),
			wantAddress: "http://10.0.0.7:80", wantReason: coordinatorv1alpha1.ReasonResolved,
		},
		"address without type is an IP": {
			gw:          gateway([]gatewayv1.Listener{httpL}, gatewayv1.GatewayStatusAddress{Value: "10.0.0.8"}),
			wantAddress: "http://10.0.0.8:80", wantReason: coordinatorv1alpha1.ReasonResolved,
		},
		"named https listener and hostname": {
			gw:          gateway([]gatewayv1.Listener{httpL, httpsL}, gatewayv1.GatewayStatusAddress{Type: &hostname, Value: "gw.example.com"}),
			ref:         coordinatorv1alpha1.GatewayReference{SectionName: "https"},
			wantAddress: "https://gw.example.com:443", wantReason: coordinatorv1alpha1.ReasonResolved,
		},
		"port override and IPv6": {
			gw:          gateway([]gatewayv1.Listener{httpL}, gatewayv1.GatewayStatusAddress{Type: &ip, Value: "fd00::1"}),
			ref:         coordinatorv1alpha1.GatewayReference{Port: ptr.To[int32](8081)},
			wantAddress: "http://[fd00::1]:8081", wantReason: coordinatorv1alpha1.ReasonResolved,
		},
		"named addresses are skipped": {
			gw: gateway([]gatewayv1.Listener{httpL},
				gatewayv1.GatewayStatusAddress{Type: &named, Value: "opaque"}, gatewayv1.GatewayStatusAddress{Type: &ip, Value: "10.0.0.9"}),
			wantAddress: "http://10.0.0.9:80", wantReason: coordinatorv1alpha1.ReasonResolved,
		},
		"no address yet": {
			gw:         gateway([]gatewayv1.Listener{httpL}),
			wantReason: coordinatorv1alpha1.ReasonAddressPending,
		},
		"no http listener": {
			gw:         gateway([]gatewayv1.Listener{tcpL}, gatewayv1.GatewayStatusAddress{Type: &ip, Value: "10.0.0.7"}),
			wantReason: coordinatorv1alpha1.ReasonListenerNotFound,
		},
		"named listener missing": {
			gw:         gateway([]gatewayv1.Listener{httpL}, gatewayv1.GatewayStatusAddress{Type: &ip, Value: "10.0.0.7"}),
			ref:        coordinatorv1alpha1.GatewayReference{SectionName: "grpc"},
			wantReason: coordinatorv1alpha1.ReasonListenerNotFound,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			tc.ref.Name = "gw"
			r := resolveGatewayAddress(tc.gw, tc.ref)
			g.Expect(r.reason).To(Equal(tc.wantReason), r.message)
			g.Expect(r.ok).To(Equal(tc.wantAddress != ""))
			g.Expect(r.address).To(Equal(tc.wantAddress))
			g.Expect(r.message).To(ContainSubstring("infra/gw"))
		})
	}
}

func TestSummarizePool(t *testing.T) {
	cond := func(typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg}
	}
	parent := func(name string, conds ...metav1.Condition) infv1.ParentStatus {
		return infv1.ParentStatus{ParentRef: infv1.ParentReference{Name: infv1.ObjectName(name)}, Conditions: conds}
	}
	tests := map[string]struct {
		parents     []infv1.ParentStatus
		wantOK      bool
		wantReason  coordinatorv1alpha1.ConditionReason
		wantMessage string
	}{
		"no parents yet": {
			wantOK: true, wantReason: coordinatorv1alpha1.ReasonResolved, wantMessage: "no parent has reported status yet",
		},
		"accepted": {
			parents: []infv1.ParentStatus{parent("gw",
				cond("Accepted", metav1.ConditionTrue, "Accepted", ""), cond("ResolvedRefs", metav1.ConditionTrue, "ResolvedRefs", ""))},
			wantOK: true, wantReason: coordinatorv1alpha1.ReasonResolved, wantMessage: "accepted by Gateway ns/gw",
		},
		"not accepted carries the parent's reason and message": {
			parents:     []infv1.ParentStatus{parent("gw", cond("Accepted", metav1.ConditionFalse, "NotSupportedByParent", "unsupported"))},
			wantReason:  coordinatorv1alpha1.ReasonNotAccepted,
			wantMessage: "InferencePool pool: parent Gateway ns/gw reports Accepted=False (NotSupportedByParent): unsupported",
		},
		"refs not resolved": {
			parents: []infv1.ParentStatus{
				parent("gw-a", cond("Accepted", metav1.ConditionTrue, "Accepted", "")),
				parent("gw-b", cond("Accepted", metav1.ConditionTrue, "Accepted", ""),
					cond("ResolvedRefs", metav1.ConditionFalse, "InvalidExtensionRef", "service epp not found")),
			},
			wantReason:  coordinatorv1alpha1.ReasonRefsNotResolved,
			wantMessage: "parent Gateway ns/gw-b reports ResolvedRefs=False (InvalidExtensionRef): service epp not found",
		},
		"pending is not a failure": {
			parents: []infv1.ParentStatus{parent("gw", cond("Accepted", metav1.ConditionUnknown, "Pending", ""))},
			wantOK:  true, wantReason: coordinatorv1alpha1.ReasonResolved,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			pool := &infv1.InferencePool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pool"}, Status: infv1.InferencePoolStatus{Parents: tc.parents}}
			r := summarizePool(pool)
			g.Expect(r.ok).To(Equal(tc.wantOK), r.message)
			g.Expect(r.reason).To(Equal(tc.wantReason))
			g.Expect(r.message).To(ContainSubstring(tc.wantMessage))
		})
	}
}
