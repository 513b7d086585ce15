package controller

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// tlsSecret is a kubernetes.io/tls Secret (its content is never read by the operator).
func tlsSecret(namespace, name, cert string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: []byte(cert), corev1.TLSPrivateKeyKey: []byte("key of " + cert)},
	}
}

// With spec.server.tls the coordinators serve HTTPS from the mounted Secret: until it exists,
// Ready=False names it (TLSSecretNotFound); once it does and the pods run, Ready=True; rotating
// it does not touch the pod template (the coordinators reload the mounted files).
func TestTLSSecretMissingThenCreatedThenRotated(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ctx := context.Background()
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Server.TLS = &coordinatorv1alpha1.ServerTLSSpec{SecretName: "epd-tls"}
	})

	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonTLSSecretNotFound)
	})
	g.Expect(expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonTLSSecretNotFound).Message).
		To(Equal("spec.server.tls.secretName: Secret epd-tls not found in namespace " + ns + "; coordinator pods cannot start until it exists"))
	expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionFalse, coordinatorv1alpha1.ReasonAsExpected)
	g.Eventually(func(g Gomega) {
		var events eventsv1.EventList
		g.Expect(e.client.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
		g.Expect(events.Items).To(ContainElement(And(
			HaveField("Type", corev1.EventTypeWarning), HaveField("Reason", "TLSSecretNotFound"),
			HaveField("Note", ContainSubstring("spec.server.tls.secretName: Secret epd-tls not found")))))
	}).Should(Succeed())

	// The children are there regardless: the pods start as soon as the Secret exists.
	c := e.children(g, ns, "epd")
	cfg, err := parseConfig(c.cm.Data[ConfigKey])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.Server.SecureServing).To(BeTrue())
	g.Expect(cfg.Server.CertPath).To(Equal(TLSDir))
	g.Expect(cfg.Server.MetricsCertDir).To(Equal(TLSDir))
	g.Expect(c.svc.Spec.Ports[0].Name).To(Equal("https"))
	g.Expect(c.svc.Spec.Ports[0].AppProtocol).To(HaveValue(Equal("https")))
	g.Expect(c.dep.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("VolumeSource.Secret.SecretName", "epd-tls")))
	g.Expect(c.dep.Spec.Template.Spec.Containers[0].ReadinessProbe.HTTPGet.Scheme).To(Equal(corev1.URISchemeHTTPS))

	g.Expect(e.client.Create(ctx, tlsSecret(ns, "epd-tls", "first"))).To(Succeed())
	e.markDeploymentAvailable(g, ns, "epd") // the pods started: the Deployment's status brings a reconcile
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})

	// Rotation: a reconcile after the Secret changed leaves the Deployment as it was.
	before := e.children(g, ns, "epd").dep
	secret := &corev1.Secret{}
	g.Expect(e.client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "epd-tls"}, secret)).To(Succeed())
	secret.Data = tlsSecret(ns, "epd-tls", "renewed").Data
	g.Expect(e.client.Update(ctx, secret)).To(Succeed())
	_, err = e.reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: "epd"}})
	g.Expect(err).NotTo(HaveOccurred())
	after := e.children(g, ns, "epd").dep
	g.Expect(after.Generation).To(Equal(before.Generation))
	g.Expect(after.ResourceVersion).To(Equal(before.ResourceVersion))
}

// A gateway CA bundle that does not exist is reported like a missing TLS Secret.
func TestGatewayCABundleMissing(t *testing.T) {
	e, g := envSuite(t), gomega(t)
	ns := e.namespace(t)
	e.createPool(t, ns, "pool")
	e.createPipeline(t, ns, "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Gateway.Address = "https://inference-gateway.infra.svc:443"
		cp.Spec.Gateway.CABundle = &coordinatorv1alpha1.CABundleReference{ConfigMapName: "gateway-ca"}
	})
	cp := e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonCABundleNotFound)
	})
	g.Expect(cp.Spec.Gateway.CABundle.Key).To(Equal("ca.crt"), "CRD default")
	c := e.children(g, ns, "epd")
	cfg, err := parseConfig(c.cm.Data[ConfigKey])
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(cfg.Gateway.CAFile).To(Equal(GatewayCAFile))

	g.Expect(e.client.Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gateway-ca"},
		Data:       map[string]string{"ca.crt": "-----BEGIN CERTIFICATE-----\n"},
	})).To(Succeed())
	e.markDeploymentAvailable(g, ns, "epd")
	e.reconciled(g, ns, "epd", func(g Gomega, cp *coordinatorv1alpha1.CoordinatorPipeline) {
		expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionTrue, coordinatorv1alpha1.ReasonReady)
	})
}
