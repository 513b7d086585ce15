package controller

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

func configMapEnv(name, prefix string) corev1.EnvFromSource {
	return corev1.EnvFromSource{Prefix: prefix, ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}
}

func secretEnv(name, prefix string) corev1.EnvFromSource {
	return corev1.EnvFromSource{Prefix: prefix, SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}
}

// An unprefixed envFrom ConfigMap with a COORDINATOR_* data key (exact case, as the coordinator
// looks names up) is refused, naming the entry and the first such key. Prefixed sources and
// binaryData make no such variable; Secrets are never read; a missing ConfigMap has no keys.
func TestEnvFromOverride(t *testing.T) {
	objects := []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "plain"}, Data: map[string]string{"APP_MODE": "fast"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "override"}, Data: map[string]string{
			"APP_MODE": "fast", "COORDINATOR_SERVER_LISTEN_ADDR": ":1", "COORDINATOR_LOG_LEVEL": "5"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "binary"}, BinaryData: map[string][]byte{"COORDINATOR_LOG_LEVEL": []byte("5")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "other-case"}, Data: map[string]string{"coordinator_log_level": "5", "Coordinator_LOG_LEVEL": "5"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "secret"}, StringData: map[string]string{"COORDINATOR_LOG_LEVEL": "5"}},
	}
	const overrideMsg = "spec.envFrom[1].configMapRef: ConfigMap override has key COORDINATOR_LOG_LEVEL, which without a prefix would override the configuration " +
		"the operator renders from the spec; remove the key or set a prefix; the configuration and the coordinator Deployment are left as they are until then"
	tests := map[string]struct {
		envFrom []corev1.EnvFromSource
		want    string // "" when nothing is refused
	}{
		"no envFrom":                            {},
		"no COORDINATOR_ key":                   {envFrom: []corev1.EnvFromSource{configMapEnv("plain", "")}},
		"COORDINATOR_ keys: the first is named": {envFrom: []corev1.EnvFromSource{configMapEnv("plain", ""), configMapEnv("override", "")}, want: overrideMsg},
		"a prefix":                              {envFrom: []corev1.EnvFromSource{configMapEnv("override", "APP_")}},
		"binaryData makes no variable":          {envFrom: []corev1.EnvFromSource{configMapEnv("binary", "")}},
		"keys in another case":                  {envFrom: []corev1.EnvFromSource{configMapEnv("other-case", "")}},
		"a missing ConfigMap":                   {envFrom: []corev1.EnvFromSource{configMapEnv("missing", "")}},
		"a Secret is not read":                  {envFrom: []corev1.EnvFromSource{secretEnv("secret", "")}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			c := fake.NewClientBuilder().WithScheme(NewScheme()).WithObjects(objects...).
				WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if _, ok := obj.(*corev1.Secret); ok {
						t.Errorf("Secret %s read", key)
					}
					return c.Get(ctx, key, obj, opts...)
				}}).Build()
			r := &CoordinatorPipelineReconciler{Client: c, APIReader: c}
			cp := newPipeline("ns", "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) { cp.Spec.EnvFrom = tc.envFrom })
			got, err := r.envFromOverride(context.Background(), cp)
			g.Expect(err).NotTo(HaveOccurred())
			if tc.want == "" {
				g.Expect(got).NotTo(HaveOccurred())
				return
			}
			g.Expect(got).To(MatchError(tc.want))
			g.Expect(envFromOverrides(got)).To(BeTrue())
			g.Expect(holdsDeployment(got)).To(BeTrue())
		})
	}
}

// A ConfigMap version whose keys were checked is not read again; a new version is.
func TestEnvFromOverrideReadsEachVersionOnce(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "settings", UID: "u1"}, Data: map[string]string{"A": "1"}}
	reads := 0
	c := fake.NewClientBuilder().WithScheme(NewScheme()).WithObjects(cm).
		WithInterceptorFuncs(interceptor.Funcs{Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.ConfigMap); ok {
				reads++
			}
			return c.Get(ctx, key, obj, opts...)
		}}).Build()
	// The fake client serves the metadata reads of the referenced ConfigMap cache too.
	r := &CoordinatorPipelineReconciler{Client: c, APIReader: c, referencedConfigMaps: c}
	cp := newPipeline("ns", "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.EnvFrom = []corev1.EnvFromSource{configMapEnv("settings", "")}
	})
	for range 3 {
		got, err := r.envFromOverride(ctx, cp)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).NotTo(HaveOccurred())
	}
	g.Expect(reads).To(Equal(1))

	g.Expect(c.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
	cm.Data["COORDINATOR_LOG_LEVEL"] = "5"
	g.Expect(c.Update(ctx, cm)).To(Succeed())
	got, err := r.envFromOverride(ctx, cp)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(MatchError(ContainSubstring("ConfigMap settings has key COORDINATOR_LOG_LEVEL")))
}

// The ConfigMaps a pipeline's envFrom uses without a prefix, once each, index its pipeline.
func TestEnvFromConfigMapNames(t *testing.T) {
	g := NewWithT(t)
	cp := newPipeline("ns", "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.EnvFrom = []corev1.EnvFromSource{
			configMapEnv("a", ""), configMapEnv("b", "APP_"), secretEnv("c", ""), configMapEnv("d", ""), configMapEnv("a", ""),
		}
	})
	g.Expect(envFromConfigMapNames(cp)).To(Equal([]string{"a", "d"}))
}
