package chart_test

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
)

// repoPath matches what only a clone of the repository has: a repository-relative path (not one
// inside a URL), a make target, a ./ path.
var repoPath = regexp.MustCompile("(^|[\\s(\"'`])(\\./|\\.\\./|config/|hack/|charts/|docs/|test/|api/|internal/|cmd/|bin/|dist/|bundle/)|\\bmake\\s+[a-z]")

// NOTES.txt speaks to someone who installed the chart, not to someone with a clone: kubectl and
// helm commands against the release, the CRD, and the docs by URL. Every branch of the template
// is rendered.
func TestNotesNeedNoClone(t *testing.T) {
	for name, vals := range valueSets {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			notes := render(t, namespace, vals).notes
			g.Expect(notes).NotTo(BeEmpty())
			for i, line := range strings.Split(notes, "\n") {
				g.Expect(repoPath.FindString(line)).To(BeEmpty(), "NOTES line %d refers to the repository: %q", i+1, line)
			}
			g.Expect(notes).To(ContainSubstring("helm test " + releaseName + " -n " + namespace))
			g.Expect(notes).To(ContainSubstring("kubectl get crd coordinatorpipelines.coordinator.epd.dev"))
			g.Expect(notes).To(ContainSubstring("kubectl get coordinatorpipelines -A -o wide"))
			g.Expect(notes).To(ContainSubstring("https://github.com/epd-dev/coordinator/blob/main/docs/upgrades.md"))
			g.Expect(notes).To(ContainSubstring("helm show readme"))
			if vals != nil && vals["crds"] != nil {
				// The CRD command renders the chart's own CRD template.
				g.Expect(notes).To(ContainSubstring("--show-only templates/crds/coordinatorpipelines.yaml"))
			}
		})
	}
	// The pattern does catch what the old NOTES had.
	for _, bad := range []string{"kubectl apply -f config/crd/bases/", "(example: config/samples/x.yaml)", "run make deploy", "see ./hack/demo"} {
		if repoPath.FindString(bad) == "" {
			t.Errorf("repoPath misses %q", bad)
		}
	}
	if s := repoPath.FindString("https://github.com/epd-dev/coordinator/blob/main/docs/api.md"); s != "" {
		t.Errorf("repoPath matches a URL: %q", s)
	}
}

// `helm test` runs a Pod that asks the operator's /healthz and /readyz through a Service, both
// test hooks; the Pod is restricted-PodSecurity compliant.
func TestHelmTestHook(t *testing.T) {
	for name, tc := range map[string]struct {
		vals           map[string]any
		port           int32
		image, service string
	}{
		"defaults": {port: 8081, image: "busybox:1.37", service: "coordinator-operator-test-health"},
		"probe port, mirror image, fullname": {
			vals: map[string]any{
				"healthProbePort":  9441,
				"fullnameOverride": "epd",
				"test":             map[string]any{"image": map[string]any{"repository": "mirror.example.com/busybox", "tag": "1.36"}},
				"imagePullSecrets": []any{map[string]any{"name": "regcred"}},
			},
			port: 9441, image: "mirror.example.com/busybox:1.36", service: "epd-test-health",
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			r := render(t, namespace, tc.vals)
			g.Expect(r.hooks).To(HaveLen(2))
			for _, h := range r.hooks {
				g.Expect(h.GetAnnotations()).To(HaveKeyWithValue("helm.sh/hook", "test"), h.GetName())
				g.Expect(h.GetAnnotations()).To(HaveKeyWithValue("helm.sh/hook-delete-policy", "before-hook-creation,hook-succeeded"), h.GetName())
				g.Expect(h.GetNamespace()).To(Equal(namespace))
			}
			svc := fromUnstructured[corev1.Service](t, hookOf(t, r, "Service"))
			pod := fromUnstructured[corev1.Pod](t, hookOf(t, r, "Pod"))
			// The Service is created first (lower weight) and selects the operator pods' probe port.
			g.Expect(svc.Annotations["helm.sh/hook-weight"]).To(Equal("-1"))
			g.Expect(pod.Annotations["helm.sh/hook-weight"]).To(Equal("0"))
			g.Expect(svc.Name).To(Equal(tc.service))
			dep := r.deployment(t)
			g.Expect(svc.Spec.Selector).To(Equal(dep.Spec.Selector.MatchLabels))
			g.Expect(svc.Spec.Ports).To(HaveLen(1))
			g.Expect(svc.Spec.Ports[0].Port).To(Equal(tc.port))
			g.Expect(svc.Spec.Ports[0].TargetPort.StrVal).To(Equal("probes"))
			c := dep.Spec.Template.Spec.Containers[0]
			g.Expect(c.Ports).To(ContainElement(corev1.ContainerPort{Name: "probes", ContainerPort: tc.port, Protocol: corev1.ProtocolTCP}))
			g.Expect(c.LivenessProbe.HTTPGet.Path).To(Equal("/healthz"))
			g.Expect(c.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))

			g.Expect(pod.Spec.RestartPolicy).To(Equal(corev1.RestartPolicyNever))
			g.Expect(pod.Spec.AutomountServiceAccountToken).To(Equal(ptr.To(false)))
			g.Expect(pod.Spec.Containers).To(HaveLen(1))
			tc0 := pod.Spec.Containers[0]
			g.Expect(tc0.Image).To(Equal(tc.image))
			g.Expect(tc0.Command[:2]).To(Equal([]string{"sh", "-c"}))
			g.Expect(tc0.Command[2]).To(ContainSubstring("for path in /healthz /readyz"))
			g.Expect(tc0.Command[2]).To(ContainSubstring(`wget -q -T 5 -O - "$BASE_URL$path"`))
			g.Expect(tc0.Env).To(ContainElement(corev1.EnvVar{Name: "BASE_URL", Value: "http://" + tc.service + "." + namespace + ".svc:" + strconv.Itoa(int(tc.port))}))
			expectRestricted(g, pod.Spec)
			g.Expect(*pod.Spec.SecurityContext.RunAsUser).To(BeNumerically(">", 0), "BusyBox runs as root unless told otherwise")
			g.Expect(pod.Spec.ImagePullSecrets).To(Equal(dep.Spec.Template.Spec.ImagePullSecrets))
		})
	}
}

func hookOf(t *testing.T, r rendered, kind string) *unstructured.Unstructured {
	t.Helper()
	for _, h := range r.hooks {
		if h.GetKind() == kind {
			return h
		}
	}
	t.Fatalf("no %s hook", kind)
	return nil
}
