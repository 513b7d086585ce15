// Package installer_test checks the single-file install, dist/install.yaml: what kustomize
// renders from config/default, what `make build-installer` (kustomize as a pinned go tool) writes
// when run exactly as docs/install.md says, and that a real API server accepts it.
package installer_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/epd-dev/coordinator/internal/packaging"
	"github.com/epd-dev/coordinator/test/harness/cluster"
)

const (
	root      = "../../.."
	namespace = "coordinator-system"
)

func from[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

func one(t *testing.T, objs []*unstructured.Unstructured, kind string) *unstructured.Unstructured {
	t.Helper()
	found := packaging.Find(objs, kind)
	if len(found) != 1 {
		t.Fatalf("want one %s, found %d", kind, len(found))
	}
	return found[0]
}

// What kustomize renders from config/default: every kind of a complete operator install, in one
// namespace under the restricted Pod Security Standard, wired together.
func TestInstallerRender(t *testing.T) {
	g := NewWithT(t)
	objs, err := packaging.Kustomize(root, "config/default")
	g.Expect(err).NotTo(HaveOccurred())

	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
		switch o.GetKind() {
		case "Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding":
			g.Expect(o.GetNamespace()).To(BeEmpty())
		default:
			g.Expect(o.GetNamespace()).To(Equal(namespace), "%s %s", o.GetKind(), o.GetName())
		}
		g.Expect(o.GetLabels()).To(HaveKeyWithValue("app.kubernetes.io/part-of", "coordinator"), "%s %s", o.GetKind(), o.GetName())
	}
	g.Expect(kinds).To(Equal(map[string]int{
		"Namespace": 1, "CustomResourceDefinition": 1, "ServiceAccount": 1, "Role": 1, "RoleBinding": 1,
		"ClusterRole": 6, "ClusterRoleBinding": 2, "Service": 1, "Deployment": 1,
	}))

	ns := one(t, objs, "Namespace")
	g.Expect(ns.GetName()).To(Equal(namespace))
	g.Expect(ns.GetLabels()).To(HaveKeyWithValue("pod-security.kubernetes.io/enforce", "restricted"))

	dep := from[appsv1.Deployment](t, one(t, objs, "Deployment"))
	g.Expect(dep.Name).To(Equal("coordinator-controller-manager"))
	pod := dep.Spec.Template.Spec
	g.Expect(pod.SecurityContext.RunAsNonRoot).To(Equal(ptr.To(true)))
	g.Expect(pod.SecurityContext.SeccompProfile.Type).To(Equal(corev1.SeccompProfileTypeRuntimeDefault))
	c := pod.Containers[0]
	g.Expect(c.Name).To(Equal(packaging.ManagerContainer))
	g.Expect(c.SecurityContext.AllowPrivilegeEscalation).To(Equal(ptr.To(false)))
	g.Expect(c.SecurityContext.ReadOnlyRootFilesystem).To(Equal(ptr.To(true)))
	g.Expect(c.SecurityContext.Capabilities.Drop).To(Equal([]corev1.Capability{"ALL"}))
	g.Expect(c.Resources.Requests).To(And(HaveKey(corev1.ResourceCPU), HaveKey(corev1.ResourceMemory)))
	g.Expect(c.Command).To(Equal([]string{"/manager"}))
	g.Expect(c.Args).To(ContainElements("--leader-elect", "--metrics-bind-address=:8443"))
	// The kustomize images transformer replaced the placeholder.
	g.Expect(c.Image).To(HavePrefix("ghcr.io/epd-dev/coordinator-operator:"))
	g.Expect(c.Env).To(ContainElement(HaveField("Name", packaging.CoordinatorImageEnv)))

	// RBAC: every binding grants a rendered role to the manager's ServiceAccount.
	sa := one(t, objs, "ServiceAccount")
	g.Expect(pod.ServiceAccountName).To(Equal(sa.GetName()))
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, b := range packaging.Find(objs, kind) {
			binding := from[rbacv1.RoleBinding](t, b)
			g.Expect(binding.Subjects).To(Equal([]rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.GetName(), Namespace: namespace}}))
			found := false
			for _, r := range packaging.Find(objs, binding.RoleRef.Kind) {
				found = found || r.GetName() == binding.RoleRef.Name
			}
			g.Expect(found).To(BeTrue(), "%s %s refers to a missing %s", kind, b.GetName(), binding.RoleRef.Name)
		}
	}

	// The metrics Service reaches the manager's metrics port.
	svc := from[corev1.Service](t, one(t, objs, "Service"))
	for k, v := range svc.Spec.Selector {
		g.Expect(dep.Spec.Template.Labels).To(HaveKeyWithValue(k, v))
	}
	g.Expect(c.Ports).To(ContainElement(HaveField("Name", svc.Spec.Ports[0].TargetPort.StrVal)))
}

// `make build-installer`, run as docs/install.md shows (into a temporary file), writes the
// kustomize render with the two images set, and leaves the tracked config/ alone.
func TestMakeBuildInstaller(t *testing.T) {
	g := NewWithT(t)
	words, err := packaging.DocCommand(root, "make build-installer")
	g.Expect(err).NotTo(HaveOccurred())
	vars := map[string]string{}
	for _, w := range words[2:] {
		k, v, ok := strings.Cut(w, "=")
		g.Expect(ok).To(BeTrue(), "argument %q of the doc's make build-installer", w)
		vars[k] = v
	}
	g.Expect(vars).To(HaveKey("IMG"))
	g.Expect(vars).To(HaveKey("COORDINATOR_IMG"))

	tracked := snapshot(t, filepath.Join(root, "config"))
	out := filepath.Join(t.TempDir(), "install.yaml")
	args := append([]string{"--no-print-directory", "-C", root}, words[1:]...)
	cmd := exec.Command("make", append(args, "INSTALLER="+out)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	g.Expect(cmd.Run()).To(Succeed(), "make build-installer: %s", stderr.String())
	g.Expect(snapshot(t, filepath.Join(root, "config"))).To(Equal(tracked), "make build-installer changed files under config/")

	data, err := os.ReadFile(out)
	g.Expect(err).NotTo(HaveOccurred())
	got, err := packaging.SplitYAML(data)
	g.Expect(err).NotTo(HaveOccurred())
	want, err := packaging.Kustomize(root, "config/default")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(packaging.SetImages(one(t, want, "Deployment"), vars["IMG"], vars["COORDINATOR_IMG"])).To(Succeed())
	g.Expect(got).To(HaveLen(len(want)))
	byKey := map[string]*unstructured.Unstructured{}
	for _, o := range got {
		byKey[o.GetKind()+"/"+o.GetName()] = o
	}
	for _, w := range want {
		o, ok := byKey[w.GetKind()+"/"+w.GetName()]
		g.Expect(ok).To(BeTrue(), "%s %s missing from %s", w.GetKind(), w.GetName(), out)
		g.Expect(equality.Semantic.DeepEqual(o.Object, w.Object)).To(BeTrue(),
			"%s %s differs from the kustomize API's render", w.GetKind(), w.GetName())
	}
	dep := one(t, got, "Deployment")
	g.Expect(packaging.ContainerImage(dep)).To(Equal(vars["IMG"]))
	v, _ := packaging.ContainerEnv(dep, packaging.CoordinatorImageEnv)
	g.Expect(v).To(Equal(vars["COORDINATOR_IMG"]))

	// The rest of the guide's kubectl path names these objects.
	apply, err := packaging.DocCommand(root, "kubectl apply --server-side -f dist/install.yaml")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(apply).To(ContainElement("dist/install.yaml"))
	rollout, err := packaging.DocCommand(root, "kubectl -n "+namespace+" rollout status deployment/coordinator-controller-manager")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rollout[len(rollout)-1]).To(Equal("deployment/" + dep.GetName()))

	// And a real API server accepts every object.
	applyAll(t, cluster.APIServer(t), got)
}

// snapshot maps every file under dir to its content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		files[path] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// applyAll applies objs (see cluster.ApplyManifests).
func applyAll(t *testing.T, c client.Client, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, err := range cluster.ApplyManifests(context.Background(), c, "installer-test", objs) {
		t.Error(err)
	}
}
