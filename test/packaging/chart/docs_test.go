package chart_test

import (
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"helm.sh/helm/v3/pkg/strvals"
	corev1 "k8s.io/api/core/v1"

	"github.com/epd-dev/coordinator/internal/packaging"
)

// docCommand returns the first command of docs/install.md starting with prefix, as words.
func docCommand(t *testing.T, prefix string) []string {
	t.Helper()
	words, err := packaging.DocCommand(root, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return words
}

// The `helm install` command of docs/install.md works as written: its chart path, namespace and
// --set values render, and each value it sets shows up where it should.
func TestInstallDocHelmCommand(t *testing.T) {
	g := NewWithT(t)
	words := docCommand(t, "helm install ")
	g.Expect(words[:2]).To(Equal([]string{"helm", "install"}))
	var positional, sets []string
	ns := "default"
	for i := 2; i < len(words); i++ {
		switch w := words[i]; w {
		case "--namespace", "-n":
			i++
			ns = words[i]
		case "--create-namespace":
		case "--set":
			i++
			sets = append(sets, words[i])
		default:
			g.Expect(w).NotTo(HavePrefix("-"), "flag %s in the doc's helm install: teach this test about it", w)
			positional = append(positional, w)
		}
	}
	g.Expect(positional).To(Equal([]string{releaseName, packaging.ChartDir}), "release name and chart directory")
	g.Expect(ns).To(Equal(namespace))

	vals := map[string]any{}
	for _, s := range sets {
		g.Expect(strvals.ParseInto(s, vals)).To(Succeed(), "--set %s", s)
	}
	r := render(t, ns, vals)
	c := r.deployment(t).Spec.Template.Spec.Containers[0]
	pod := r.deployment(t).Spec.Template.Spec
	checked := 0
	for _, s := range sets {
		key, value, _ := strings.Cut(s, "=")
		checked++
		switch {
		case key == "image.tag":
			g.Expect(c.Image).To(Equal("ghcr.io/epd-dev/coordinator-operator:" + value))
		case key == "coordinator.image.tag":
			g.Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: packaging.CoordinatorImageEnv, Value: "ghcr.io/epd-dev/coordinator:" + value}))
		case key == "logLevel":
			g.Expect(c.Args).To(ContainElement("--zap-log-level=" + value))
		case strings.HasPrefix(key, "nodeSelector."):
			label := strings.ReplaceAll(strings.TrimPrefix(key, "nodeSelector."), `\.`, ".")
			g.Expect(pod.NodeSelector).To(HaveKeyWithValue(label, value))
		default:
			t.Errorf("the doc sets %s; teach TestInstallDocHelmCommand to check it", key)
		}
	}
	g.Expect(checked).To(BeNumerically(">", 0))

	// The rollout command that follows names the Deployment the chart renders.
	rollout := docCommand(t, "kubectl -n coordinator-system rollout status deployment/coordinator-operator-")
	g.Expect(rollout[len(rollout)-1]).To(Equal("deployment/" + r.deployment(t).Name))
}
