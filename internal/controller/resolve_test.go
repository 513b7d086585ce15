package controller

import (
	"strings"
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
		"a metadata-service status address is refused": {
			gw:         gateway([]gatewayv1.Listener{httpL}, gatewayv1.GatewayStatusAddress{Type: &ip, Value: "169.254.169.254"}),
			wantReason: coordinatorv1alpha1.ReasonAddressNotAllowed,
		},
		"an unspecified status address is refused": {
			gw:         gateway([]gatewayv1.Listener{httpL}, gatewayv1.GatewayStatusAddress{Type: &ip, Value: "0.0.0.0"}),
			wantReason: coordinatorv1alpha1.ReasonAddressNotAllowed,
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

// The controller refuses the gateway hosts the CRD's CEL rules refuse (for objects stored before
// the rules, and for addresses read from a Gateway's status), naming the reason.
func TestCheckGatewayHost(t *testing.T) {
	const (
		unspec    = "must not be an unspecified address"
		linkLocal = "must not be link-local (169.254.0.0/16, fe80::/10)"
		metadata  = "must not be a cloud instance metadata service (100.100.100.200, fd00:ec2::254)"
		mdName    = "must not be a cloud instance metadata service name"
		canonical = "must be a DNS name or an IP address in canonical form"
	)
	tests := map[string]struct {
		address string
		wantErr string // "" accepts
	}{
		"AWS, Azure, GCP metadata":   {"http://169.254.169.254/latest", linkLocal},
		"IPv6 link-local":            {"http://[fe80::1]:80", linkLocal},
		"AWS IMDS over IPv6":         {"http://[fd00:ec2::254]", metadata},
		"Alibaba Cloud metadata":     {"http://100.100.100.200", metadata},
		"GCP metadata name":          {"http://Metadata.Google.Internal.", mdName},
		"GCP metadata short name":    {"http://metadata:80", mdName},
		"localhost (a sidecar)":      {"http://localhost:8080", ""},
		"IPv4 loopback":              {"http://127.0.0.1:8080", ""},
		"IPv6 loopback":              {"http://[::1]", ""},
		"unspecified":                {"http://0.0.0.0", unspec},
		"this network":               {"http://0.1.2.3", unspec},
		"IPv4-mapped IPv6":           {"http://[::ffff:169.254.169.254]", canonical},
		"IPv6 zone":                  {"http://[fe80::1%25eth0]", canonical},
		"decimal IPv4":               {"http://2852039166", canonical},
		"octal IPv4":                 {"http://0251.0376.0251.0376", canonical},
		"hexadecimal IPv4":           {"http://0xa9fea9fe", canonical},
		"IPv4 with a trailing dot":   {"http://169.254.169.254.", canonical},
		"user information":           {"http://gw@169.254.169.254", canonical},
		"percent-encoding":           {"http://%31%36%39.254.169.254", canonical},
		"cluster Service":            {"http://inference-gateway.infra.svc.cluster.local:80/x", ""},
		"private IPv4":               {"http://10.96.0.10", ""},
		"unique local IPv6 and port": {"https://[fd00::10]:443", ""},
		"external name":              {"https://1e100.example.com", ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := checkGatewayHost(addressHost(tc.address))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("checkGatewayHost(%q): %v", tc.address, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("checkGatewayHost(%q) = %v, want an error containing %q", tc.address, err, tc.wantErr)
			}
			res := explicitGateway(tc.address)
			if res.ok || res.reason != coordinatorv1alpha1.ReasonAddressNotAllowed || !strings.HasPrefix(res.message, "spec.gateway.address: host ") {
				t.Fatalf("explicitGateway(%q) = %+v, want GatewayResolved=False (AddressNotAllowed) naming the field", tc.address, res)
			}
		})
	}
}
