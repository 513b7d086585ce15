package controller

import (
	"errors"
	"fmt"
	pathpkg "path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/render"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

// Tokenizers (spec.tokenizers): directories of Hugging Face tokenizer files that the coordinator
// pods mount read-only at coordinatorv1alpha1.TokenizersMountPath/<name>, for render steps that
// tokenize in process (their tokenizer param). The operator checks that every such param names a
// declared directory, builds the pipeline with the files of ConfigMap sources (copied to a private
// directory, tokenizerfiles.go) and renders a fingerprint of each such ConfigMap's content as the
// step's tokenizer_revision, so that editing the ConfigMap changes the configuration and the
// coordinators reload it (and the files) in place. The files of a PersistentVolumeClaim are on a
// volume only the pods mount: the operator validates the step's params alone, and the pods check
// the files when they load them.

const (
	// tokenizerVolumePrefix names the pod volume of each tokenizer: tokenizer-<name>.
	tokenizerVolumePrefix = "tokenizer-"
	// tokenizerParam and tokenizerRevisionParam are the render step's params the operator reads
	// and writes.
	tokenizerParam         = "tokenizer"
	tokenizerRevisionParam = "tokenizer_revision"
)

// tokenizerDir is the directory where the coordinator pods mount the tokenizer named name.
func tokenizerDir(name string) string {
	return coordinatorv1alpha1.TokenizersMountPath + "/" + name
}

// tokenizerVolumeName is the pod volume of the tokenizer named name.
func tokenizerVolumeName(name string) string { return tokenizerVolumePrefix + name }

// isTokenizerVolume reports whether a volume named name would take the place of one of cp's
// tokenizer volumes.
func isTokenizerVolume(cp *coordinatorv1alpha1.CoordinatorPipeline, name string) bool {
	return slices.ContainsFunc(cp.Spec.Tokenizers, func(t coordinatorv1alpha1.Tokenizer) bool {
		return tokenizerVolumeName(t.Name) == name
	})
}

// shadowsTokenizerMount reports whether a spec.volumeMounts path would sit at or under the
// tokenizers' directory of cp's pods (compared cleaned). Only with spec.tokenizers set: without,
// the directory is the user's.
func shadowsTokenizerMount(cp *coordinatorv1alpha1.CoordinatorPipeline, path string) bool {
	if len(cp.Spec.Tokenizers) == 0 {
		return false
	}
	return withinDir(pathpkg.Clean(path), coordinatorv1alpha1.TokenizersMountPath)
}

// withinDir reports whether the clean path p is dir or below it.
func withinDir(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// addTokenizerVolumes mounts each spec.tokenizers entry read-only at its directory: a ConfigMap
// volume (every key a file; the kubelet refreshes them when the ConfigMap changes) or the
// PersistentVolumeClaim (read-only, at its subPath). A missing ConfigMap or claim keeps new pods
// from starting: the operator does not change the Deployment while a ConfigMap is missing
// (tokenizerNotFoundError).
func addTokenizerVolumes(cp *coordinatorv1alpha1.CoordinatorPipeline, volumes []corev1.Volume, mounts []corev1.VolumeMount) ([]corev1.Volume, []corev1.VolumeMount) {
	for _, t := range cp.Spec.Tokenizers {
		v := corev1.Volume{Name: tokenizerVolumeName(t.Name)}
		m := corev1.VolumeMount{Name: v.Name, MountPath: tokenizerDir(t.Name), ReadOnly: true}
		switch {
		case t.ConfigMap != nil:
			v.ConfigMap = &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: t.ConfigMap.Name},
				Optional:             ptr.To(false),
			}
		case t.PersistentVolumeClaim != nil:
			v.PersistentVolumeClaim = &corev1.PersistentVolumeClaimVolumeSource{ClaimName: t.PersistentVolumeClaim.ClaimName, ReadOnly: true}
			m.SubPath = t.PersistentVolumeClaim.SubPath
		default:
			continue // refused by the CRD: exactly one source
		}
		volumes = append(volumes, v)
		mounts = append(mounts, m)
	}
	return volumes, mounts
}

// tokenizerStep is a render step of the configuration that loads a tokenizer directory.
type tokenizerStep struct {
	// key is the step's key, e.g. pipeline.steps[1] or canary.pipeline.steps[0].
	key string
	// dir is its tokenizer param.
	dir string
	// params are the step's params (the rendered configuration's own map).
	params map[string]any
}

// paramKey is the key of the step's tokenizer param.
func (s tokenizerStep) paramKey() string { return s.key + ".params." + tokenizerParam }

// tokenizerSteps lists the render steps of cfg whose tokenizer param is a string, those of the
// stable pipeline first. A tokenizer param of another type is left to the data plane's check.
func tokenizerSteps(cfg *config.Config) []tokenizerStep {
	var out []tokenizerStep
	add := func(key string, steps []config.Step) {
		for i, s := range steps {
			if s.Type != string(coordinatorv1alpha1.StepRender) {
				continue
			}
			if dir, ok := s.Params[tokenizerParam].(string); ok && dir != "" {
				out = append(out, tokenizerStep{key: fmt.Sprintf("%s.steps[%d]", key, i), dir: dir, params: s.Params})
			}
		}
	}
	add("pipeline", cfg.Pipeline.Steps)
	if cfg.Canary != nil {
		add("canary.pipeline", cfg.Canary.Pipeline.Steps)
	}
	return out
}

// tokenizerFor returns the index of the entry of spec.tokenizers whose directory holds dir (dir
// itself, or a directory below it), -1 when none does. dir must be clean.
func tokenizerFor(cp *coordinatorv1alpha1.CoordinatorPipeline, dir string) int {
	return slices.IndexFunc(cp.Spec.Tokenizers, func(t coordinatorv1alpha1.Tokenizer) bool {
		return withinDir(dir, tokenizerDir(t.Name))
	})
}

// describeTokenizer names a tokenizer's directory and source, e.g.
// "/var/run/coordinator/tokenizers/qwen (ConfigMap qwen-tokenizer)".
func describeTokenizer(t coordinatorv1alpha1.Tokenizer) string {
	switch {
	case t.ConfigMap != nil:
		return fmt.Sprintf("%s (ConfigMap %s)", tokenizerDir(t.Name), t.ConfigMap.Name)
	case t.PersistentVolumeClaim != nil:
		src := "PersistentVolumeClaim " + t.PersistentVolumeClaim.ClaimName
		if p := t.PersistentVolumeClaim.SubPath; p != "" {
			src += ", subPath " + p
		}
		return fmt.Sprintf("%s (%s)", tokenizerDir(t.Name), src)
	}
	return tokenizerDir(t.Name)
}

// checkTokenizerDirs returns a *config.FieldError naming the tokenizer param of the first step of
// steps whose directory is not one of cp's tokenizers (or below one): the coordinator pods would
// not find the files there. A param that is not an absolute, clean path is left to the data
// plane, whose error says so.
func checkTokenizerDirs(cp *coordinatorv1alpha1.CoordinatorPipeline, steps []tokenizerStep) error {
	for _, s := range steps {
		if !pathpkg.IsAbs(s.dir) || pathpkg.Clean(s.dir) != s.dir || tokenizerFor(cp, s.dir) >= 0 {
			continue
		}
		declared := "none is declared"
		if len(cp.Spec.Tokenizers) > 0 {
			names := make([]string, len(cp.Spec.Tokenizers))
			for i, t := range cp.Spec.Tokenizers {
				names[i] = describeTokenizer(t)
			}
			declared = "declared: " + strings.Join(names, ", ")
		}
		return &config.FieldError{Key: s.paramKey(), Reason: fmt.Sprintf(
			"%s is not the directory of a tokenizer of spec.tokenizers, which the coordinator pods mount at %s/<name>: name one of them, or a directory below one (%s)",
			s.dir, coordinatorv1alpha1.TokenizersMountPath, declared)}
	}
	return nil
}

// setTokenizerRevisions sets the tokenizer_revision param of each step whose tokenizer is a
// ConfigMap source to revisions[name] (tokenizerRevision of the ConfigMap), replacing a value the
// spec sets: the coordinators reload when it changes. Steps of a PersistentVolumeClaim keep the
// spec's value, the only way to make them reload files changed on the volume.
func setTokenizerRevisions(cp *coordinatorv1alpha1.CoordinatorPipeline, steps []tokenizerStep, revisions map[string]string) {
	for _, s := range steps {
		i := tokenizerFor(cp, s.dir)
		if i < 0 || cp.Spec.Tokenizers[i].ConfigMap == nil {
			continue
		}
		if rev, ok := revisions[cp.Spec.Tokenizers[i].Name]; ok {
			s.params[tokenizerRevisionParam] = rev
		}
	}
}

// podCheckedTokenizers describes the steps of steps whose tokenizer files the operator cannot read
// (a PersistentVolumeClaim source): the coordinator pods check them when they load them.
func podCheckedTokenizers(cp *coordinatorv1alpha1.CoordinatorPipeline, steps []tokenizerStep) []string {
	var out []string
	for _, s := range steps {
		if i := tokenizerFor(cp, s.dir); i >= 0 && cp.Spec.Tokenizers[i].PersistentVolumeClaim != nil {
			out = append(out, fmt.Sprintf("%s (PersistentVolumeClaim %s)", s.paramKey(), cp.Spec.Tokenizers[i].PersistentVolumeClaim.ClaimName))
		}
	}
	return out
}

// tokenizerRevision fingerprints a ConfigMap's files (render.Revision): every key of data
// and binaryData by name and content (a data value counts as its UTF-8 bytes, as the kubelet
// writes it). The same files give the same revision whatever the ConfigMap's name or
// resourceVersion, and the render step computes it from the mounted directory: a pod whose
// configuration is ahead of its tokenizer volume waits for the files instead of loading old ones.
func tokenizerRevision(cm *corev1.ConfigMap) string {
	return render.Revision(configMapFiles(cm))
}

// configMapFiles are the files a ConfigMap volume of cm holds, by name: every key of its data
// and binaryData.
func configMapFiles(cm *corev1.ConfigMap) map[string][]byte {
	files := make(map[string][]byte, len(cm.Data)+len(cm.BinaryData))
	for k, v := range cm.Data {
		files[k] = []byte(v)
	}
	for k, v := range cm.BinaryData {
		files[k] = v
	}
	return files
}

// tokenizerNotFoundError is a ConfigMap of spec.tokenizers that does not exist. It is reported as
// PipelineValid=False, reason TokenizerNotFound; the configuration and the Deployment are left as
// they are until it exists (its creation is watched).
type tokenizerNotFoundError struct {
	index                int
	configMap, namespace string
	// usedBy are the tokenizer params that name its directory.
	usedBy []string
}

func (e *tokenizerNotFoundError) Error() string {
	used := "no render step uses it yet, but the coordinator pods mount it"
	if len(e.usedBy) > 0 {
		used = "the tokenizer of " + strings.Join(e.usedBy, ", ")
	}
	return fmt.Sprintf("spec.tokenizers[%d].configMap.name: ConfigMap %s not found in namespace %s (%s); "+
		"the configuration and the coordinator Deployment are left as they are until it exists",
		e.index, e.configMap, e.namespace, used)
}

// missingTokenizer builds the error of cp's tokenizer i, whose ConfigMap does not exist.
func missingTokenizer(cp *coordinatorv1alpha1.CoordinatorPipeline, i int, steps []tokenizerStep) *tokenizerNotFoundError {
	e := &tokenizerNotFoundError{index: i, configMap: cp.Spec.Tokenizers[i].ConfigMap.Name, namespace: cp.Namespace}
	for _, s := range steps {
		if tokenizerFor(cp, s.dir) == i {
			e.usedBy = append(e.usedBy, s.paramKey())
		}
	}
	return e
}

// tokenizerMissing reports whether err (the pipeline result) is a missing tokenizer ConfigMap.
func tokenizerMissing(err error) bool {
	var te *tokenizerNotFoundError
	return errors.As(err, &te)
}

// holdsDeployment reports whether err, the pipeline result, keeps the operator from changing the
// Deployment: a refused coordinator image (its pods would reject the configuration), a missing
// tokenizer ConfigMap (new pods could not mount it), tokenizer files that do not load (new pods
// would mount them with the last good configuration, and fail to start) or an envFrom ConfigMap
// with a COORDINATOR_* key (new pods would override the configuration with it). The last good
// configuration and pod template keep running.
func holdsDeployment(err error) bool {
	return imageRefused(err) || tokenizerMissing(err) || envFromOverrides(err) ||
		strings.HasSuffix(config.KeyOf(err), ".params."+tokenizerParam)
}

// localDirs maps the directory of a tokenizer in the coordinator pods to a local copy of its files
// that the operator validates the pipeline with.
type localDirs map[string]string

// lookup is builder.Overrides.LocalFiles: the local copy of dir (a tokenizer's directory or a
// directory below it). Any other directory, a PersistentVolumeClaim's included, is not read: the
// step then checks its params alone. The operator never reads a path of its own file system that
// a spec names.
func (d localDirs) lookup(dir string) (string, bool) {
	for pod, local := range d {
		if withinDir(dir, pod) {
			return local + dir[len(pod):], true
		}
	}
	return "", false
}

// podPaths rewrites the local copies' paths in err (a *config.FieldError from building the
// pipeline) back to the directories the pods mount, so that the message names what the user
// knows; other errors are returned as they are.
func (d localDirs) podPaths(err error) error {
	var fe *config.FieldError
	if len(d) == 0 || !errors.As(err, &fe) {
		return err
	}
	reason := fe.Reason
	for pod, local := range d {
		reason = strings.ReplaceAll(reason, local, pod)
	}
	if reason == fe.Reason {
		return err
	}
	return &config.FieldError{Key: fe.Key, Reason: reason}
}
