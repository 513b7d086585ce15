package packaging

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/blang/semver/v4"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Paths of the OLM bundle, relative to the repository root.
const (
	BundleDir        = "bundle"
	BundleDockerfile = "bundle.Dockerfile"
	// ManifestsKustomization is the kustomization the bundle is built from: the base CSV
	// (config/manifests/bases), config/default and config/samples.
	ManifestsKustomization = "config/manifests"

	annotationsFile = "metadata/annotations.yaml"
	// watchNamespaceEnv is the manager's --watch-namespace default. In the bundle it comes from
	// the olm.targetNamespaces annotation OLM puts on the operator's pods, so the OwnNamespace
	// and SingleNamespace install modes restrict the manager to the target namespace.
	watchNamespaceEnv = "WATCH_NAMESPACE"
)

// BundleOptions are the inputs of a bundle besides config/.
type BundleOptions struct {
	// Version is the operator's semantic version (no leading v); the CSV is named
	// coordinator-operator.v<Version>.
	Version string
	// OperatorImage and CoordinatorImage are the manager image and the default coordinator image.
	OperatorImage, CoordinatorImage string
	// Channels and DefaultChannel are the OLM channels the bundle is published in.
	Channels       []string
	DefaultChannel string
}

func (o BundleOptions) validate() error {
	if _, err := semver.Parse(o.Version); err != nil {
		return fmt.Errorf("version %q: %w", o.Version, err)
	}
	if o.OperatorImage == "" || o.CoordinatorImage == "" {
		return fmt.Errorf("the operator and coordinator images are required")
	}
	if len(o.Channels) == 0 || (o.DefaultChannel != "" && !slices.Contains(o.Channels, o.DefaultChannel)) {
		return fmt.Errorf("channels %v must be non-empty and contain the default channel %q", o.Channels, o.DefaultChannel)
	}
	return nil
}

// Bundle renders the registry+v1 bundle, what `operator-sdk generate bundle` makes of
// `kustomize build config/manifests`: files keyed by their path relative to the repository root
// (bundle/manifests/*, bundle/metadata/annotations.yaml, bundle.Dockerfile).
//
// The CSV is the base CSV with the version, the images, the install strategy (the manager
// Deployment, and the rules of every Role and ClusterRole bound to its ServiceAccount as
// permissions and clusterPermissions) and alm-examples (config/samples) filled in. The CRD and the
// remaining objects (the metrics Service, unbound ClusterRoles) become manifests of their own;
// the Namespace, the ServiceAccount and the bindings are OLM's to create.
func Bundle(root string, opts BundleOptions) (map[string][]byte, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	objs, err := Kustomize(root, ManifestsKustomization)
	if err != nil {
		return nil, err
	}
	byKind := func(kind string) []*unstructured.Unstructured { return Find(objs, kind) }

	csvs, deps := byKind("ClusterServiceVersion"), byKind("Deployment")
	if len(csvs) != 1 || len(deps) != 1 {
		return nil, fmt.Errorf("%s: want one ClusterServiceVersion and one Deployment, found %d and %d", ManifestsKustomization, len(csvs), len(deps))
	}
	csv, dep := csvs[0].DeepCopy(), deps[0].DeepCopy()
	if err := SetImages(dep, opts.OperatorImage, opts.CoordinatorImage); err != nil {
		return nil, err
	}
	if err := addWatchNamespace(dep); err != nil {
		return nil, err
	}
	sa, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "spec", "serviceAccountName")
	if sa == "" {
		return nil, fmt.Errorf("Deployment %s has no serviceAccountName", dep.GetName()) //nolint:staticcheck // ST1005: a Kubernetes kind
	}

	consumed := map[*unstructured.Unstructured]bool{csvs[0]: true, deps[0]: true}
	// The manager's own ClusterRole (watchNamespaceRoles) becomes permissions, not
	// clusterPermissions: OLM grants permissions as Roles in the target namespace in the
	// OwnNamespace and SingleNamespace install modes, where the manager watches that namespace
	// only, and lifts them to a ClusterRole in the AllNamespaces mode.
	clusterRules, managerRules, err := boundRules(objs, "ClusterRoleBinding", "ClusterRole", sa, dep.GetNamespace(), consumed)
	if err != nil {
		return nil, err
	}
	nsRules, _, err := boundRules(objs, "RoleBinding", "Role", sa, dep.GetNamespace(), consumed)
	if err != nil {
		return nil, err
	}
	nsRules = append(managerRules, nsRules...)

	files := map[string][]byte{}
	var examples []any
	var crdNames []string
	for _, o := range objs {
		switch {
		case consumed[o]:
			continue
		case o.GetKind() == "Namespace", o.GetKind() == "ServiceAccount" && o.GetName() == sa:
			continue
		case o.GetKind() == "CustomResourceDefinition":
			group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
			plural, _, _ := unstructured.NestedString(o.Object, "spec", "names", "plural")
			if err := addYAML(files, fmt.Sprintf("%s/manifests/%s_%s.yaml", BundleDir, group, plural), o.Object); err != nil {
				return nil, err
			}
			crdNames = append(crdNames, o.GetName())
			if err := setOwnedCRD(csv, o); err != nil {
				return nil, err
			}
		case strings.HasSuffix(o.GetAPIVersion(), "coordinator.epd.dev/v1alpha1"):
			examples = append(examples, o.Object)
		default:
			obj := o.DeepCopy()
			obj.SetNamespace("")
			if err := addYAML(files, BundleDir+"/manifests/"+manifestName(obj), obj.Object); err != nil {
				return nil, err
			}
		}
	}
	if err := checkOwnedCRDs(csv, crdNames); err != nil {
		return nil, err
	}
	if len(examples) == 0 {
		return nil, fmt.Errorf("%s: no samples for alm-examples (config/samples)", ManifestsKustomization)
	}
	almExamples, err := json.MarshalIndent(examples, "", "  ")
	if err != nil {
		return nil, err
	}

	name := PackageName + ".v" + opts.Version
	csv.SetName(name)
	csv.SetNamespace("")
	annotations := csv.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations["alm-examples"] = string(almExamples)
	annotations["containerImage"] = opts.OperatorImage
	csv.SetAnnotations(annotations)
	strategy := map[string]any{
		"deployments": []any{map[string]any{
			"name":  dep.GetName(),
			"label": toAnyMap(dep.GetLabels()),
			"spec":  dep.Object["spec"],
		}},
	}
	if len(clusterRules) > 0 {
		strategy["clusterPermissions"] = []any{map[string]any{"serviceAccountName": sa, "rules": clusterRules}}
	}
	if len(nsRules) > 0 {
		strategy["permissions"] = []any{map[string]any{"serviceAccountName": sa, "rules": nsRules}}
	}
	install := map[string]any{"strategy": "deployment", "spec": strategy}
	for path, v := range map[string]any{
		"spec.version": opts.Version,
		"spec.install": install,
		"spec.relatedImages": []any{
			map[string]any{"name": "coordinator", "image": opts.CoordinatorImage},
			map[string]any{"name": ManagerContainer, "image": opts.OperatorImage},
		},
	} {
		if err := unstructured.SetNestedField(csv.Object, v, strings.Split(path, ".")...); err != nil {
			return nil, fmt.Errorf("CSV %s: %w", path, err)
		}
	}
	if err := addYAML(files, fmt.Sprintf("%s/manifests/%s.clusterserviceversion.yaml", BundleDir, PackageName), csv.Object); err != nil {
		return nil, err
	}

	labels := bundleAnnotations(opts)
	if err := addYAML(files, BundleDir+"/"+annotationsFile, map[string]any{"annotations": toAnyMap(labels)}); err != nil {
		return nil, err
	}
	files[BundleDockerfile] = bundleDockerfile(labels)
	return files, nil
}

// boundRules collects, in binding order, the rules of the roles of roleKind that bindings of
// bindingKind grant to ServiceAccount namespace/sa, and marks both as consumed. The rules of the
// roles in watchNamespaceRoles are returned apart, as scoped.
func boundRules(objs []*unstructured.Unstructured, bindingKind, roleKind, sa, namespace string, consumed map[*unstructured.Unstructured]bool) (rules, scoped []any, err error) {
	roles := map[string]*unstructured.Unstructured{}
	for _, r := range Find(objs, roleKind) {
		roles[r.GetName()] = r
	}
	for _, b := range Find(objs, bindingKind) {
		subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
		bound := false
		for _, s := range subjects {
			sm, _ := s.(map[string]any)
			if sm["kind"] == "ServiceAccount" && sm["name"] == sa && (sm["namespace"] == namespace || sm["namespace"] == nil) {
				bound = true
			}
		}
		if !bound {
			continue
		}
		if len(subjects) != 1 {
			return nil, nil, fmt.Errorf("%s %s binds more than the manager's ServiceAccount; OLM cannot express that", bindingKind, b.GetName())
		}
		refKind, _, _ := unstructured.NestedString(b.Object, "roleRef", "kind")
		refName, _, _ := unstructured.NestedString(b.Object, "roleRef", "name")
		role, ok := roles[refName]
		if refKind != roleKind || !ok {
			return nil, nil, fmt.Errorf("%s %s refers to %s %s, which is not in the bundle input", bindingKind, b.GetName(), refKind, refName)
		}
		r, _, _ := unstructured.NestedSlice(role.Object, "rules")
		if roleKind == "ClusterRole" && watchNamespaceRoles[RoleSuffix(refName)] {
			scoped = append(scoped, r...)
		} else {
			rules = append(rules, r...)
		}
		consumed[b], consumed[role] = true, true
	}
	return rules, scoped, nil
}

// addWatchNamespace gives the manager container WATCH_NAMESPACE from the olm.targetNamespaces
// annotation (empty, so every namespace, in the AllNamespaces install mode).
func addWatchNamespace(dep *unstructured.Unstructured) error {
	containers, _, err := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	if err != nil {
		return err
	}
	for i, c := range containers {
		cm, _ := c.(map[string]any)
		if cm["name"] != ManagerContainer {
			continue
		}
		env, _ := cm["env"].([]any)
		cm["env"] = append(env, map[string]any{
			"name": watchNamespaceEnv,
			"valueFrom": map[string]any{"fieldRef": map[string]any{
				"fieldPath": "metadata.annotations['olm.targetNamespaces']",
			}},
		})
		containers[i] = cm
	}
	return unstructured.SetNestedSlice(dep.Object, containers, "spec", "template", "spec", "containers")
}

// setOwnedCRD keeps the CSV's owned entry for crd in step with it (version and kind); the base
// CSV supplies its display name and description.
func setOwnedCRD(csv, crd *unstructured.Unstructured) error {
	owned, _, _ := unstructured.NestedSlice(csv.Object, "spec", "customresourcedefinitions", "owned")
	kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	storage := ""
	for _, v := range versions {
		if vm, _ := v.(map[string]any); vm["storage"] == true {
			storage, _ = vm["name"].(string)
		}
	}
	for i, o := range owned {
		om, _ := o.(map[string]any)
		if om["name"] != crd.GetName() {
			continue
		}
		om["kind"], om["version"] = kind, storage
		owned[i] = om
		return unstructured.SetNestedSlice(csv.Object, owned, "spec", "customresourcedefinitions", "owned")
	}
	return fmt.Errorf("the base CSV (config/manifests/bases) has no spec.customresourcedefinitions.owned entry for %s: add one with a displayName and description", crd.GetName())
}

func checkOwnedCRDs(csv *unstructured.Unstructured, bundled []string) error {
	owned, _, _ := unstructured.NestedSlice(csv.Object, "spec", "customresourcedefinitions", "owned")
	for _, o := range owned {
		om, _ := o.(map[string]any)
		if name, _ := om["name"].(string); !slices.Contains(bundled, name) {
			return fmt.Errorf("the base CSV owns %s, which config/crd does not define", name)
		}
	}
	return nil
}

// manifestName is operator-sdk's file name for an extra bundle object:
// <name>_<group>_<version>_<kind>.yaml (no group for the core API).
func manifestName(o *unstructured.Unstructured) string {
	gv := strings.ReplaceAll(o.GetAPIVersion(), "/", "_")
	return fmt.Sprintf("%s_%s_%s.yaml", o.GetName(), gv, strings.ToLower(o.GetKind()))
}

// bundleAnnotations are the bundle's metadata/annotations.yaml, repeated as bundle.Dockerfile
// labels.
func bundleAnnotations(opts BundleOptions) map[string]string {
	a := map[string]string{
		"operators.operatorframework.io.bundle.mediatype.v1": "registry+v1",
		"operators.operatorframework.io.bundle.manifests.v1": "manifests/",
		"operators.operatorframework.io.bundle.metadata.v1":  "metadata/",
		"operators.operatorframework.io.bundle.package.v1":   PackageName,
		"operators.operatorframework.io.bundle.channels.v1":  strings.Join(opts.Channels, ","),
	}
	if opts.DefaultChannel != "" {
		a["operators.operatorframework.io.bundle.channel.default.v1"] = opts.DefaultChannel
	}
	return a
}

func bundleDockerfile(labels map[string]string) []byte {
	var b bytes.Buffer
	b.WriteString("# Code generated by hack/bundlegen (`make bundle`); DO NOT EDIT.\n")
	b.WriteString("# The OLM bundle image: `make bundle-build BUNDLE_IMG=...`.\nFROM scratch\n\n")
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "LABEL %s=%s\n", k, labels[k])
	}
	b.WriteString("\nCOPY bundle/manifests /manifests/\nCOPY bundle/metadata /metadata/\n")
	return b.Bytes()
}

// ReadBundleOptions recovers the options a checked-in bundle was generated with (its version,
// images and channels), so it can be regenerated and compared.
func ReadBundleOptions(root string) (BundleOptions, error) {
	var opts BundleOptions
	data, err := os.ReadFile(filepath.Join(root, BundleDir, annotationsFile))
	if err != nil {
		return opts, err
	}
	var meta struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return opts, fmt.Errorf("%s: %w", annotationsFile, err)
	}
	opts.Channels = strings.Split(meta.Annotations["operators.operatorframework.io.bundle.channels.v1"], ",")
	opts.DefaultChannel = meta.Annotations["operators.operatorframework.io.bundle.channel.default.v1"]

	data, err = os.ReadFile(filepath.Join(root, BundleDir, "manifests", PackageName+".clusterserviceversion.yaml"))
	if err != nil {
		return opts, err
	}
	var csv struct {
		Spec struct {
			Version       string `json:"version"`
			RelatedImages []struct {
				Name  string `json:"name"`
				Image string `json:"image"`
			} `json:"relatedImages"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &csv); err != nil {
		return opts, fmt.Errorf("CSV: %w", err)
	}
	opts.Version = csv.Spec.Version
	for _, ri := range csv.Spec.RelatedImages {
		switch ri.Name {
		case ManagerContainer:
			opts.OperatorImage = ri.Image
		case "coordinator":
			opts.CoordinatorImage = ri.Image
		}
	}
	return opts, opts.validate()
}

// BundleFiles lists the files of the checked-in bundle (the same keys Bundle returns).
func BundleFiles(root string) (map[string][]byte, error) {
	files := map[string][]byte{}
	err := filepath.WalkDir(filepath.Join(root, BundleDir), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		files[filepath.ToSlash(rel)], err = os.ReadFile(path)
		return err
	})
	if err != nil {
		return nil, err
	}
	df, err := os.ReadFile(filepath.Join(root, BundleDockerfile))
	if err != nil {
		return nil, err
	}
	files[BundleDockerfile] = df
	return files, nil
}

// WriteFiles writes files under root. With clean, it first removes the bundle's manifests and
// metadata, so objects dropped from config/ do not linger.
func WriteFiles(root string, files map[string][]byte, clean bool) error {
	if clean {
		for _, d := range []string{"manifests", "metadata"} {
			if err := os.RemoveAll(filepath.Join(root, BundleDir, d)); err != nil {
				return err
			}
		}
	}
	for rel, data := range files {
		path := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Diff names the files that differ between want (generated) and got (checked in).
func Diff(want, got map[string][]byte) []string {
	var out []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			out = append(out, k+": missing")
		case !bytes.Equal(w, g):
			out = append(out, k+": differs")
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			out = append(out, k+": not generated (stale)")
		}
	}
	slices.Sort(out)
	return out
}

func addYAML(files map[string][]byte, path string, v any) error {
	out, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if _, dup := files[path]; dup {
		return fmt.Errorf("two objects map to %s", path)
	}
	files[path] = append([]byte("---\n"), out...)
	return nil
}

func toAnyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
