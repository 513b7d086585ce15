// Package bundle_test validates the OLM bundle (bundle/) with the validators behind
// `operator-sdk bundle validate` (github.com/operator-framework/api), and checks that it is what
// `make bundle` generates from config/ today.
package bundle_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"github.com/operator-framework/api/pkg/manifests"
	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	"github.com/operator-framework/api/pkg/validation"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
	"github.com/epd-dev/coordinator/internal/packaging"
	"github.com/epd-dev/coordinator/test/internal/makefile"
)

const root = "../../.."

// kubeVersion is the Kubernetes version the deprecated-API checks target.
const kubeVersion = "1.33"

func loadBundle(t *testing.T) *manifests.Bundle {
	t.Helper()
	b, err := manifests.GetBundleFromDir(filepath.Join(root, packaging.BundleDir))
	if err != nil {
		t.Fatalf("loading the bundle: %v", err)
	}
	return b
}

// Zero errors and zero warnings (see validate for the validators).
func TestBundleValidates(t *testing.T) {
	errs, warns := validate(t, loadBundle(t))
	for _, e := range errs {
		t.Errorf("error: %s", e)
	}
	for _, w := range warns {
		t.Errorf("warning: %s", w)
	}
}

// The validation above is not vacuous: a bundle with typical mistakes gets errors and warnings.
func TestValidationCatchesProblems(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	files, err := packaging.BundleFiles(root)
	g.Expect(err).NotTo(HaveOccurred())
	for rel, data := range files {
		rel, ok := strings.CutPrefix(rel, packaging.BundleDir+"/")
		if !ok {
			continue
		}
		switch {
		case strings.HasSuffix(rel, ".clusterserviceversion.yaml"):
			data = []byte(strings.Replace(string(data), "minKubeVersion:", "x-removed-minKubeVersion:", 1))
			data = []byte(strings.Replace(string(data), "  maintainers:\n  - email: maintainers@epd.dev", "  maintainers:\n  - email: not-an-address", 1))
		case rel == "metadata/annotations.yaml":
			data = []byte(strings.ReplaceAll(string(data), ": candidate", ": alpha"))
		}
		path := filepath.Join(dir, rel)
		g.Expect(os.MkdirAll(filepath.Dir(path), 0o755)).To(Succeed())
		g.Expect(os.WriteFile(path, data, 0o644)).To(Succeed())
	}
	b, err := manifests.GetBundleFromDir(dir)
	g.Expect(err).NotTo(HaveOccurred())
	errs, warns := validate(t, b)
	g.Expect(strings.Join(errs, "\n")).To(ContainSubstring("not-an-address"))
	g.Expect(strings.Join(warns, "\n")).To(And(ContainSubstring("minKubeVersion"), ContainSubstring("alpha")))
}

// validate runs the default bundle validators (what `operator-sdk bundle validate` runs) plus
// the optional suites: OperatorHub (v2, standard capabilities and categories), good practices,
// objects (PDBs, RBAC), and APIs removed by kubeVersion. MultipleArchitecturesValidator is left
// out: it pulls the images from their registry.
func validate(t *testing.T, b *manifests.Bundle) (errs, warns []string) {
	t.Helper()
	validators := validation.DefaultBundleValidators.WithValidators(
		validation.OperatorHubV2Validator,
		validation.StandardCapabilitiesValidator,
		validation.StandardCategoriesValidator,
		validation.GoodPracticesValidator,
		validation.ObjectValidator,
		validation.AlphaDeprecatedAPIsValidator,
	)
	objs := append(b.ObjectsToValidate(), map[string]string{"k8s-version": kubeVersion})
	results := validators.Validate(objs...)
	if len(results) < len(validators) {
		t.Fatalf("only %d results from %d validators: the bundle was not recognized", len(results), len(validators))
	}
	for _, r := range results {
		for _, e := range r.Errors {
			errs = append(errs, r.Name+": "+e.Error())
		}
		for _, w := range r.Warnings {
			warns = append(warns, r.Name+": "+w.Error())
		}
	}
	return errs, warns
}

// The checked-in bundle is what `make bundle` generates from config/ today, with the version,
// images and channels recorded in it.
func TestBundleIsFresh(t *testing.T) {
	opts, err := packaging.ReadBundleOptions(root)
	if err != nil {
		t.Fatalf("reading the bundle's options: %v", err)
	}
	want, err := packaging.Bundle(root, opts)
	if err != nil {
		t.Fatal(err)
	}
	got, err := packaging.BundleFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	if diff := packaging.Diff(want, got); len(diff) > 0 {
		t.Fatalf("bundle/ is stale (run `make bundle`):\n  %s", strings.Join(diff, "\n  "))
	}
}

// The bundle is the Makefile's release: OPERATOR_VERSION and the default images.
func TestBundleFollowsTheMakefile(t *testing.T) {
	opts, err := packaging.ReadBundleOptions(root)
	if err != nil {
		t.Fatal(err)
	}
	version := makefile.Var(t, root, "OPERATOR_VERSION")
	g := NewWithT(t)
	g.Expect(opts.Version).To(Equal(version))
	g.Expect(opts.OperatorImage).To(Equal(strings.ReplaceAll(makefile.Var(t, root, "IMG"), "$(OPERATOR_VERSION)", version)))
	g.Expect(opts.CoordinatorImage).To(Equal(strings.ReplaceAll(makefile.Var(t, root, "COORDINATOR_IMG"), "$(OPERATOR_VERSION)", version)))
	g.Expect(opts.Channels).To(Equal([]string{makefile.Var(t, root, "BUNDLE_CHANNELS")}))
	g.Expect(opts.DefaultChannel).To(Equal(makefile.Var(t, root, "BUNDLE_DEFAULT_CHANNEL")))
}

func TestBundleContents(t *testing.T) {
	g := NewWithT(t)
	b := loadBundle(t)
	csv := b.CSV
	opts, err := packaging.ReadBundleOptions(root)
	g.Expect(err).NotTo(HaveOccurred())

	g.Expect(csv.Name).To(Equal("coordinator-operator.v" + opts.Version))
	g.Expect(b.Package).To(Equal("coordinator-operator"))
	g.Expect(csv.Spec.MinKubeVersion).NotTo(BeEmpty())
	g.Expect(csv.Annotations).To(HaveKeyWithValue("containerImage", opts.OperatorImage))
	g.Expect(csv.Spec.RelatedImages).To(ConsistOf(
		operatorsv1alpha1.RelatedImage{Name: "manager", Image: opts.OperatorImage},
		operatorsv1alpha1.RelatedImage{Name: "coordinator", Image: opts.CoordinatorImage},
	))

	// The icon is config/manifests/icon.svg.
	icon, err := os.ReadFile(filepath.Join(root, "config/manifests/icon.svg"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(csv.Spec.Icon).To(HaveLen(1))
	g.Expect(csv.Spec.Icon[0].Data).To(Equal(base64.StdEncoding.EncodeToString(icon)))

	// Install modes: all namespaces, or one (the manager reads olm.targetNamespaces).
	modes := map[operatorsv1alpha1.InstallModeType]bool{}
	for _, m := range csv.Spec.InstallModes {
		modes[m.Type] = m.Supported
	}
	g.Expect(modes).To(Equal(map[operatorsv1alpha1.InstallModeType]bool{
		operatorsv1alpha1.InstallModeTypeOwnNamespace: true, operatorsv1alpha1.InstallModeTypeSingleNamespace: true,
		operatorsv1alpha1.InstallModeTypeMultiNamespace: false, operatorsv1alpha1.InstallModeTypeAllNamespaces: true,
	}))

	// The install strategy runs the manager Deployment of config/manager with the images.
	g.Expect(csv.Spec.InstallStrategy.StrategyName).To(Equal(operatorsv1alpha1.InstallStrategyNameDeployment))
	deps := csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs
	g.Expect(deps).To(HaveLen(1))
	pod := deps[0].Spec.Template.Spec
	c := pod.Containers[0]
	g.Expect(c.Image).To(Equal(opts.OperatorImage))
	g.Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: packaging.CoordinatorImageEnv, Value: opts.CoordinatorImage}))
	g.Expect(c.Env).To(ContainElement(HaveField("ValueFrom.FieldRef.FieldPath", "metadata.annotations['olm.targetNamespaces']")))
	g.Expect(c.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
	g.Expect(pod.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))

	// Permissions, all for the Deployment's ServiceAccount: the controller-gen ClusterRole's rules
	// and the leader-election Role as permissions (OLM makes them Roles in the target namespace in
	// the OwnNamespace and SingleNamespace modes, where the manager watches that namespace only,
	// and ClusterRoles in the AllNamespaces mode); only the metrics auth rules (cluster-scoped
	// TokenReviews and SubjectAccessReviews) as clusterPermissions.
	managerRole := &rbacv1.ClusterRole{}
	data, err := os.ReadFile(filepath.Join(root, "config/rbac/role.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(yaml.UnmarshalStrict(data, managerRole)).To(Succeed())
	perms := csv.Spec.InstallStrategy.StrategySpec.Permissions
	g.Expect(perms).To(HaveLen(1))
	g.Expect(perms[0].ServiceAccountName).To(Equal(pod.ServiceAccountName))
	g.Expect(perms[0].Rules[:len(managerRole.Rules)]).To(Equal(managerRole.Rules))
	g.Expect(perms[0].Rules[len(managerRole.Rules):]).To(ContainElement(HaveField("Resources", []string{"leases"})))
	cp := csv.Spec.InstallStrategy.StrategySpec.ClusterPermissions
	g.Expect(cp).To(HaveLen(1))
	g.Expect(cp[0].ServiceAccountName).To(Equal(pod.ServiceAccountName))
	for _, rule := range cp[0].Rules {
		g.Expect(rule.APIGroups).To(ConsistOf(BeElementOf("authentication.k8s.io", "authorization.k8s.io")), "cluster-wide: %+v", rule)
	}
	g.Expect(cp[0].Rules).To(ContainElement(HaveField("Resources", []string{"tokenreviews"})))

	// The owned CRD is config/crd/bases' CRD.
	want := &apiextensionsv1.CustomResourceDefinition{}
	data, err = os.ReadFile(filepath.Join(root, "config/crd/bases/coordinator.epd.dev_coordinatorpipelines.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(yaml.UnmarshalStrict(data, want)).To(Succeed())
	g.Expect(b.V1CRDs).To(HaveLen(1))
	g.Expect(equality.Semantic.DeepEqual(b.V1CRDs[0].Spec, want.Spec)).To(BeTrue(), "bundle CRD differs from config/crd/bases")
	owned := csv.Spec.CustomResourceDefinitions.Owned
	g.Expect(owned).To(HaveLen(1))
	g.Expect(owned[0].Name).To(Equal(want.Name))
	g.Expect(owned[0].Version).To(Equal("v1alpha1"))
	g.Expect(owned[0].Kind).To(Equal("CoordinatorPipeline"))

	// alm-examples are the samples, valid CoordinatorPipelines.
	var examples []coordinatorv1alpha1.CoordinatorPipeline
	g.Expect(json.Unmarshal([]byte(csv.Annotations["alm-examples"]), &examples)).To(Succeed())
	g.Expect(examples).To(HaveLen(1))
	sample := &coordinatorv1alpha1.CoordinatorPipeline{}
	data, err = os.ReadFile(filepath.Join(root, "config/samples/coordinator_v1alpha1_coordinatorpipeline.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(yaml.UnmarshalStrict(data, sample)).To(Succeed())
	gotJSON, err := json.Marshal(examples[0].Spec) // compacts the params' raw JSON
	g.Expect(err).NotTo(HaveOccurred())
	wantJSON, err := json.Marshal(sample.Spec)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(gotJSON)).To(MatchJSON(wantJSON), "alm-examples differ from config/samples")

	// The bundle image's labels are metadata/annotations.yaml.
	meta := struct {
		Annotations map[string]string `json:"annotations"`
	}{}
	data, err = os.ReadFile(filepath.Join(root, packaging.BundleDir, "metadata/annotations.yaml"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(yaml.UnmarshalStrict(data, &meta)).To(Succeed())
	dockerfile, err := os.ReadFile(filepath.Join(root, packaging.BundleDockerfile))
	g.Expect(err).NotTo(HaveOccurred())
	labels := map[string]string{}
	for _, line := range strings.Split(string(dockerfile), "\n") {
		if kv, ok := strings.CutPrefix(line, "LABEL "); ok {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = v
		}
	}
	g.Expect(labels).To(Equal(meta.Annotations))
	g.Expect(meta.Annotations).To(HaveKeyWithValue("operators.operatorframework.io.bundle.mediatype.v1", "registry+v1"))
	g.Expect(string(dockerfile)).To(ContainSubstring("COPY bundle/manifests /manifests/"))
}
