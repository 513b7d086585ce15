package controller

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/epd-dev/coordinator/dataplane/base/config"

	coordinatorv1alpha1 "github.com/epd-dev/coordinator/api/v1alpha1"
)

const (
	qwenDir  = coordinatorv1alpha1.TokenizersMountPath + "/qwen"
	llamaDir = coordinatorv1alpha1.TokenizersMountPath + "/llama"
)

// testTokenizerFiles are the files of a small tokenizer: a synthetic Qwen-like byte-level BPE
// tokenizer.json (dataplane/render/tokenizer/testdata) and a ChatML tokenizer_config.json.
func testTokenizerFiles(t testing.TB) map[string]string {
	t.Helper()
	tok, err := os.ReadFile("../../dataplane/render/tokenizer/testdata/qwen-like/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"tokenizer.json":        string(tok),
		"tokenizer_config.json": `{"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}", "eos_token": "<|im_end|>"}`,
	}
}

// withTokenizers declares tokenizers and puts a render step loading dir first in the pipeline
// (pipeline.steps[0]); an empty dir adds no step.
func withTokenizers(dir string, tokenizers ...coordinatorv1alpha1.Tokenizer) func(*coordinatorv1alpha1.CoordinatorPipeline) {
	return func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Tokenizers = tokenizers
		if dir != "" {
			render := coordinatorv1alpha1.PipelineStep{Type: coordinatorv1alpha1.StepRender, Params: params(map[string]any{"tokenizer": dir})}
			cp.Spec.Pipeline.Steps = append([]coordinatorv1alpha1.PipelineStep{render}, cp.Spec.Pipeline.Steps...)
		}
	}
}

func configMapTokenizer(name, configMap string) coordinatorv1alpha1.Tokenizer {
	return coordinatorv1alpha1.Tokenizer{Name: name, ConfigMap: &coordinatorv1alpha1.TokenizerConfigMapSource{Name: configMap}}
}

func claimTokenizer(name, claim, subPath string) coordinatorv1alpha1.Tokenizer {
	return coordinatorv1alpha1.Tokenizer{Name: name, PersistentVolumeClaim: &coordinatorv1alpha1.TokenizerPersistentVolumeClaimSource{ClaimName: claim, SubPath: subPath}}
}

// The coordinator pods mount each tokenizer read-only at its directory: a ConfigMap as it is, a
// claim read-only at its subPath; their container keeps the end of its log as the termination
// message. A spec volume or mount that would take the place of a tokenizer's is left out; without
// tokenizers the tokenizers' directory is the user's.
func TestDesiredDeploymentTokenizers(t *testing.T) {
	cfg, err := renderConfig(newPipeline("ns", "epd"), testGateway)
	if err != nil {
		t.Fatal(err)
	}
	userVolume := func(name string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	}
	tests := map[string]struct {
		mutate      func(*coordinatorv1alpha1.CoordinatorPipeline)
		wantVolumes []corev1.Volume // beyond config and tmp
		wantMounts  []corev1.VolumeMount
		wantPolicy  corev1.TerminationMessagePolicy
	}{
		"none": {mutate: func(*coordinatorv1alpha1.CoordinatorPipeline) {}},
		"a ConfigMap and a claim": {
			mutate: withTokenizers("", configMapTokenizer("qwen", "qwen-tokenizer"), claimTokenizer("llama", "models", "llama-3/tokenizer")),
			wantVolumes: []corev1.Volume{
				{Name: "tokenizer-qwen", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "qwen-tokenizer"}, Optional: ptr.To(false)}}},
				{Name: "tokenizer-llama", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{
					ClaimName: "models", ReadOnly: true}}},
			},
			wantMounts: []corev1.VolumeMount{
				{Name: "tokenizer-qwen", MountPath: qwenDir, ReadOnly: true},
				{Name: "tokenizer-llama", MountPath: llamaDir, ReadOnly: true, SubPath: "llama-3/tokenizer"},
			},
			wantPolicy: corev1.TerminationMessageFallbackToLogsOnError,
		},
		"a spec volume named like a tokenizer's and a mount in their directory are left out": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				withTokenizers("", configMapTokenizer("qwen", "qwen-tokenizer"))(cp)
				cp.Spec.Volumes = []corev1.Volume{userVolume("tokenizer-qwen"), userVolume("tokenizer-other"), userVolume("data")}
				cp.Spec.VolumeMounts = []corev1.VolumeMount{
					{Name: "data", MountPath: coordinatorv1alpha1.TokenizersMountPath + "//qwen/x"},
					{Name: "data", MountPath: "/var/run/coordinator/tokenizers"},
					{Name: "tokenizer-other", MountPath: "/models"},
				}
			},
			wantVolumes: []corev1.Volume{
				{Name: "tokenizer-qwen", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "qwen-tokenizer"}, Optional: ptr.To(false)}}},
				userVolume("tokenizer-other"), userVolume("data"),
			},
			wantMounts: []corev1.VolumeMount{
				{Name: "tokenizer-qwen", MountPath: qwenDir, ReadOnly: true},
				{Name: "tokenizer-other", MountPath: "/models"},
			},
			wantPolicy: corev1.TerminationMessageFallbackToLogsOnError,
		},
		"without tokenizers their directory is the user's": {
			mutate: func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Volumes = []corev1.Volume{userVolume("tokenizer-qwen")}
				cp.Spec.VolumeMounts = []corev1.VolumeMount{{Name: "tokenizer-qwen", MountPath: qwenDir}}
			},
			wantVolumes: []corev1.Volume{userVolume("tokenizer-qwen")},
			wantMounts:  []corev1.VolumeMount{{Name: "tokenizer-qwen", MountPath: qwenDir}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			dep := desiredDeployment(newPipeline("ns", "epd", tc.mutate), cfg, "img")
			pod := dep.Spec.Template.Spec
			g.Expect(pod.Volumes[2:]).To(Equal(append([]corev1.Volume{}, tc.wantVolumes...)))
			c := pod.Containers[0]
			g.Expect(c.VolumeMounts[2:]).To(Equal(append([]corev1.VolumeMount{}, tc.wantMounts...)))
			g.Expect(c.TerminationMessagePolicy).To(Equal(tc.wantPolicy))
		})
	}
}

// A render step's tokenizer must be a declared tokenizer's directory or a directory below it; the
// error names the step's param and lists the declared directories. What is not an absolute, clean
// path is the data plane's to refuse.
func TestCheckTokenizerDirs(t *testing.T) {
	declared := []coordinatorv1alpha1.Tokenizer{configMapTokenizer("qwen", "qwen-tokenizer"), claimTokenizer("llama", "models", "llama")}
	const listed = "declared: /var/run/coordinator/tokenizers/qwen (ConfigMap qwen-tokenizer), /var/run/coordinator/tokenizers/llama (PersistentVolumeClaim models, subPath llama)"
	tests := map[string]struct {
		tokenizers []coordinatorv1alpha1.Tokenizer
		stable     any // the stable render step's tokenizer param (nil: no render step)
		canary     any // the canary's (nil: no canary)
		wantErr    string
	}{
		"a declared directory":            {tokenizers: declared, stable: qwenDir},
		"below a declared directory":      {tokenizers: declared, stable: llamaDir + "/v2"},
		"no render step":                  {tokenizers: declared},
		"a render step without tokenizer": {tokenizers: declared, stable: ""},
		"not declared": {tokenizers: declared, stable: "/models/qwen",
			wantErr: "pipeline.steps[0].params.tokenizer: /models/qwen is not the directory of a tokenizer of spec.tokenizers, which the coordinator pods mount at /var/run/coordinator/tokenizers/<name>: name one of them, or a directory below one (" + listed + ")"},
		"a sibling sharing a prefix": {tokenizers: declared, stable: qwenDir + "2",
			wantErr: "pipeline.steps[0].params.tokenizer: /var/run/coordinator/tokenizers/qwen2 is not the directory"},
		"the parent of the tokenizers": {tokenizers: declared, stable: coordinatorv1alpha1.TokenizersMountPath,
			wantErr: "pipeline.steps[0].params.tokenizer: /var/run/coordinator/tokenizers is not the directory"},
		"none declared": {stable: qwenDir,
			wantErr: "pipeline.steps[0].params.tokenizer: /var/run/coordinator/tokenizers/qwen is not the directory of a tokenizer of spec.tokenizers, which the coordinator pods mount at /var/run/coordinator/tokenizers/<name>: name one of them, or a directory below one (none is declared)"},
		"the canary's step": {tokenizers: declared, stable: qwenDir, canary: "/srv/tok",
			wantErr: "canary.pipeline.steps[0].params.tokenizer: /srv/tok is not the directory"},
		"a relative path is the data plane's": {tokenizers: declared, stable: "tok"},
		"an unclean path is the data plane's": {tokenizers: declared, stable: qwenDir + "/../llama"},
		"a number is the data plane's":        {tokenizers: declared, stable: 7},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cp := newPipeline("ns", "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
				cp.Spec.Tokenizers = tc.tokenizers
				render := func(dir any) coordinatorv1alpha1.PipelineStep {
					return coordinatorv1alpha1.PipelineStep{Type: coordinatorv1alpha1.StepRender, Params: params(map[string]any{"tokenizer": dir})}
				}
				if tc.stable != nil {
					cp.Spec.Pipeline.Steps = append([]coordinatorv1alpha1.PipelineStep{render(tc.stable)}, cp.Spec.Pipeline.Steps...)
				}
				if tc.canary != nil {
					cp.Spec.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: 10, Pipeline: coordinatorv1alpha1.PipelineSpec{
						Steps: []coordinatorv1alpha1.PipelineStep{render(tc.canary), {Type: coordinatorv1alpha1.StepDecode}}}}
				}
			})
			cfg, err := renderConfig(cp, testGateway)
			g.Expect(err).NotTo(HaveOccurred())
			err = checkTokenizerDirs(cp, tokenizerSteps(&cfg))
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			var fe *config.FieldError
			g.Expect(errors.As(err, &fe)).To(BeTrue(), "a *config.FieldError: %v", err)
			g.Expect(err.Error()).To(HavePrefix(tc.wantErr))
		})
	}
}

// tokenizer_revision fingerprints a ConfigMap's files, names and contents, and nothing else.
func TestTokenizerRevision(t *testing.T) {
	cm := func(data map[string]string, binary map[string][]byte, mutate ...func(*corev1.ConfigMap)) *corev1.ConfigMap {
		c := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "tok", ResourceVersion: "1", UID: "u"}, Data: data, BinaryData: binary}
		for _, m := range mutate {
			m(c)
		}
		return c
	}
	base := tokenizerRevision(cm(map[string]string{"tokenizer.json": "{}", "tokenizer_config.json": "{\"a\":1}"}, nil))
	tests := map[string]struct {
		cm   *corev1.ConfigMap
		same bool
	}{
		"the same files": {cm: cm(map[string]string{"tokenizer_config.json": "{\"a\":1}", "tokenizer.json": "{}"}, nil), same: true},
		"another name, version and labels": {cm: cm(map[string]string{"tokenizer.json": "{}", "tokenizer_config.json": "{\"a\":1}"}, nil, func(c *corev1.ConfigMap) {
			c.Name, c.ResourceVersion, c.UID, c.Labels = "other", "99", "v", map[string]string{"a": "b"}
		}), same: true},
		"a file in binaryData with the same bytes": {cm: cm(map[string]string{"tokenizer.json": "{}"}, map[string][]byte{"tokenizer_config.json": []byte("{\"a\":1}")}), same: true},
		"a changed file":                       {cm: cm(map[string]string{"tokenizer.json": "{ }", "tokenizer_config.json": "{\"a\":1}"}, nil)},
		"an added file":                        {cm: cm(map[string]string{"tokenizer.json": "{}", "tokenizer_config.json": "{\"a\":1}", "chat_template.jinja": ""}, nil)},
		"a renamed file":                       {cm: cm(map[string]string{"tokenizer.json": "{}", "tokenizer_config.jso": "{\"a\":1}"}, nil)},
		"content moved between name and value": {cm: cm(map[string]string{"tokenizer.json": "{}", "tokenizer_config.json{": "\"a\":1}"}, nil)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			got := tokenizerRevision(tc.cm)
			g.Expect(got).To(MatchRegexp("^sha256:[0-9a-f]{16}$"))
			if tc.same {
				g.Expect(got).To(Equal(base))
			} else {
				g.Expect(got).NotTo(Equal(base))
			}
		})
	}
}

// The operator renders a ConfigMap tokenizer's revision into every step loading it (over the
// spec's value); a claim's steps keep the spec's, the user's way to reload changed files.
func TestSetTokenizerRevisions(t *testing.T) {
	g := NewWithT(t)
	cp := newPipeline("ns", "epd", func(cp *coordinatorv1alpha1.CoordinatorPipeline) {
		cp.Spec.Tokenizers = []coordinatorv1alpha1.Tokenizer{configMapTokenizer("qwen", "qwen-tokenizer"), claimTokenizer("llama", "models", "")}
		cp.Spec.Pipeline.Steps = append([]coordinatorv1alpha1.PipelineStep{{Type: coordinatorv1alpha1.StepRender,
			Params: params(map[string]any{"tokenizer": qwenDir + "/sub", "tokenizer_revision": "mine"})}}, cp.Spec.Pipeline.Steps...)
		cp.Spec.Canary = &coordinatorv1alpha1.CanarySpec{WeightPercent: 5, Pipeline: coordinatorv1alpha1.PipelineSpec{Steps: []coordinatorv1alpha1.PipelineStep{
			{Type: coordinatorv1alpha1.StepRender, Params: params(map[string]any{"tokenizer": llamaDir, "tokenizer_revision": "v7"})},
			{Type: coordinatorv1alpha1.StepDecode},
		}}}
	})
	cfg, err := renderConfig(cp, testGateway)
	g.Expect(err).NotTo(HaveOccurred())
	before := cfg.Revision()
	setTokenizerRevisions(cp, tokenizerSteps(&cfg), map[string]string{"qwen": "0123456789abcdef", "llama": "fedcba9876543210"})
	g.Expect(cfg.Pipeline.Steps[0].Params).To(HaveKeyWithValue("tokenizer_revision", "0123456789abcdef"))
	g.Expect(cfg.Canary.Pipeline.Steps[0].Params).To(HaveKeyWithValue("tokenizer_revision", "v7"))
	g.Expect(cfg.Revision()).NotTo(Equal(before), "the configuration changes with the files: the coordinators reload")
	g.Expect(podCheckedTokenizers(cp, tokenizerSteps(&cfg))).To(Equal([]string{"canary.pipeline.steps[0].params.tokenizer (PersistentVolumeClaim models)"}))
}

// The builder reads a tokenizer's directory (and below) from its local copy, nothing else; errors
// name the pods' paths.
func TestLocalDirs(t *testing.T) {
	g := NewWithT(t)
	d := localDirs{qwenDir: "/tmp/copies/cm-1"}
	for dir, want := range map[string]string{qwenDir: "/tmp/copies/cm-1", qwenDir + "/v2": "/tmp/copies/cm-1/v2"} {
		got, ok := d.lookup(dir)
		g.Expect(ok).To(BeTrue(), dir)
		g.Expect(got).To(Equal(want), dir)
	}
	for _, dir := range []string{qwenDir + "2", llamaDir, "/etc", coordinatorv1alpha1.TokenizersMountPath} {
		_, ok := d.lookup(dir)
		g.Expect(ok).To(BeFalse(), dir)
	}
	_, ok := localDirs(nil).lookup(qwenDir)
	g.Expect(ok).To(BeFalse())

	err := d.podPaths(&config.FieldError{Key: "pipeline.steps[0].params.tokenizer", Reason: "chattemplate: /tmp/copies/cm-1/tokenizer_config.json: jinja parse: x"})
	g.Expect(err).To(MatchError("pipeline.steps[0].params.tokenizer: chattemplate: " + qwenDir + "/tokenizer_config.json: jinja parse: x"))
	g.Expect(config.KeyOf(err)).To(Equal("pipeline.steps[0].params.tokenizer"))
	other := errors.New("/tmp/copies/cm-1")
	g.Expect(d.podPaths(other)).To(BeIdenticalTo(other), "only field errors are rewritten")
}

// validatePipeline builds a render step with the local copy of its tokenizer: the data plane's
// own errors (a broken tokenizer.json, a chat template it cannot run) name the step's param and the
// pods' paths. A directory without a copy (a claim's, or any path of the operator's own file
// system) is never read: the step's params alone are checked.
func TestValidatePipelineWithTokenizerFiles(t *testing.T) {
	files := testTokenizerFiles(t)
	tests := map[string]struct {
		files   map[string]string // the copy's files; nil: no copy
		dir     string
		wantErr string
	}{
		"good files": {files: files, dir: qwenDir},
		"broken tokenizer.json": {files: map[string]string{"tokenizer.json": "{", "tokenizer_config.json": files["tokenizer_config.json"]}, dir: qwenDir,
			wantErr: "pipeline.steps[0].params.tokenizer: tokenizer.json: unexpected end of JSON input"},
		"an unsupported chat template": {files: map[string]string{"tokenizer.json": files["tokenizer.json"], "tokenizer_config.json": `{"chat_template": "{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}"}`}, dir: qwenDir,
			wantErr: `pipeline.steps[0].params.tokenizer: chattemplate: /var/run/coordinator/tokenizers/qwen/tokenizer_config.json: render: unknown filter "nosuchfilter"`},
		"no tokenizer.json": {files: map[string]string{"tokenizer_config.json": files["tokenizer_config.json"]}, dir: qwenDir,
			wantErr: "pipeline.steps[0].params.tokenizer: open /var/run/coordinator/tokenizers/qwen/tokenizer.json: no such file or directory"},
		"a directory below the copy that is not there": {files: files, dir: qwenDir + "/v2",
			wantErr: "pipeline.steps[0].params.tokenizer: open /var/run/coordinator/tokenizers/qwen/v2/tokenizer.json: no such file or directory"},
		"no copy: params only": {dir: llamaDir},
		"no copy: a bad param is still refused": {dir: "relative/dir",
			wantErr: `pipeline.steps[0].params.tokenizer: must be an absolute, clean directory path, got "relative/dir"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			var dirs localDirs
			if tc.files != nil {
				local := t.TempDir()
				for k, v := range tc.files {
					g.Expect(os.WriteFile(filepath.Join(local, k), []byte(v), 0o600)).To(Succeed())
				}
				dirs = localDirs{qwenDir: local}
			}
			cfg, err := renderConfig(newPipeline("ns", "epd", withTokenizers(tc.dir)), testGateway)
			g.Expect(err).NotTo(HaveOccurred())
			err = validatePipeline(cfg, dirs)
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(HaveOccurred())
			g.Expect(err.Error()).To(HavePrefix(tc.wantErr))
			g.Expect(err.Error()).NotTo(ContainSubstring(os.TempDir()), "the local copy's path is not shown")
		})
	}

	// A directory of the operator's own file system holding broken files is not read.
	g := NewWithT(t)
	own := t.TempDir()
	g.Expect(os.WriteFile(filepath.Join(own, "tokenizer.json"), []byte("{"), 0o600)).To(Succeed())
	cfg, err := renderConfig(newPipeline("ns", "epd", withTokenizers(own)), testGateway)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(validatePipeline(cfg, nil)).To(Succeed())
}

// Copies are made once per ConfigMap version, hold its keys as files, are shared while in use,
// are bounded when unused (least recently used removed first) and removed on close.
func TestTokenizerCopies(t *testing.T) {
	g := NewWithT(t)
	t.Setenv("TMPDIR", t.TempDir())
	var c tokenizerCopies
	cm := func(uid, rv string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "tok", UID: types.UID(uid), ResourceVersion: rv},
			Data: map[string]string{"tokenizer.json": "{} " + uid + rv}, BinaryData: map[string][]byte{"extra.bin": {0, 1, 2}}}
	}
	g.Expect(c.lookup("a", "1")).To(BeNil())
	first, err := c.add(cm("a", "1"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(first.revision).To(Equal(tokenizerRevision(cm("a", "1"))))
	data, err := os.ReadFile(filepath.Join(first.dir, "tokenizer.json"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(data)).To(Equal("{} a1"))
	bin, err := os.ReadFile(filepath.Join(first.dir, "extra.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(bin).To(Equal([]byte{0, 1, 2}))
	info, err := os.Stat(filepath.Join(first.dir, "tokenizer.json"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Mode().Perm()).To(Equal(os.FileMode(0o400)))

	again := c.lookup("a", "1")
	g.Expect(again).To(BeIdenticalTo(first), "one copy per version")
	g.Expect(c.lookup("a", "2")).To(BeNil(), "a new version is a new copy")
	c.release(again)

	// Fill the cache past its bound while the first copy is in use: it stays, the least recently
	// used idle ones go.
	var dirs []string
	for i := range maxTokenizerCopies + 4 {
		e, err := c.add(cm("b", string(rune('a'+i))))
		g.Expect(err).NotTo(HaveOccurred())
		dirs = append(dirs, e.dir)
		c.release(e)
	}
	g.Expect(c.entries).To(HaveLen(maxTokenizerCopies))
	g.Expect(first.dir).To(BeADirectory(), "in use")
	g.Expect(dirs[0]).NotTo(BeAnExistingFile(), "the least recently used idle copy is removed")
	g.Expect(dirs[len(dirs)-1]).To(BeADirectory())
	c.release(first)
	g.Expect(first.dir).To(BeADirectory(), "within the bound: kept")
	e, err := c.add(cm("d", "1"))
	g.Expect(err).NotTo(HaveOccurred())
	c.release(e)
	g.Expect(c.entries).To(HaveLen(maxTokenizerCopies))
	g.Expect(first.dir).NotTo(BeAnExistingFile(), "idle and the least recently used: removed")

	// Closing removes the unused copies at once, a copy in use when it is released (a reconcile
	// running while the manager stops keeps its files), and then the directory.
	root := c.root
	inUse := c.lookup("d", "1")
	g.Expect(inUse).NotTo(BeNil())
	g.Expect(c.close()).To(Succeed())
	g.Expect(c.entries).To(HaveLen(1))
	g.Expect(inUse.dir).To(BeADirectory(), "in use")
	late, err := c.add(cm("c", "1"))
	g.Expect(err).NotTo(HaveOccurred(), "a reconcile racing the stop still validates")
	c.release(inUse)
	g.Expect(inUse.dir).NotTo(BeAnExistingFile())
	g.Expect(root).To(BeADirectory())
	c.release(late)
	g.Expect(c.entries).To(BeEmpty())
	g.Expect(root).NotTo(BeAnExistingFile())
}

// A missing tokenizer ConfigMap is PipelineValid=False with its own reason, which Ready and
// Degraded carry; a claim's tokenizer is named as checked by the pods.
func TestTokenizerStatus(t *testing.T) {
	cfg, err := renderConfig(newPipeline("ns", "cp"), testGateway)
	if err != nil {
		t.Fatal(err)
	}
	okPool := found(resolution{ok: true, reason: coordinatorv1alpha1.ReasonResolved})
	okGateway := found(resolution{ok: true, reason: coordinatorv1alpha1.ReasonAddressSet, address: testGateway})
	cp := newPipeline("ns", "cp", withTokenizers(qwenDir, configMapTokenizer("qwen", "qwen-tokenizer")))
	missing := missingTokenizer(cp, 0, []tokenizerStep{{key: "pipeline.steps[0]", dir: qwenDir}})

	t.Run("missing ConfigMap", func(t *testing.T) {
		g := NewWithT(t)
		cp := cp.DeepCopy()
		cp.Status.ConfigRevision = "3f1c9a7be04d2e61"
		computeStatus(cp, observed{pool: okPool, gateway: okGateway, pipeline: found[error](missing), applied: found(&cfg), deployment: found(deployment(1, nil))})
		want := "spec.tokenizers[0].configMap.name: ConfigMap qwen-tokenizer not found in namespace ns (the tokenizer of pipeline.steps[0].params.tokenizer); " +
			"the configuration and the coordinator Deployment are left as they are until it exists"
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionFalse, coordinatorv1alpha1.ReasonTokenizerNotFound)
		g.Expect(c.Message).To(Equal(want))
		c = expectCondition(g, cp, coordinatorv1alpha1.ConditionReady, metav1.ConditionFalse, coordinatorv1alpha1.ReasonTokenizerNotFound)
		g.Expect(c.Message).To(Equal(want))
		c = expectCondition(g, cp, coordinatorv1alpha1.ConditionDegraded, metav1.ConditionTrue, coordinatorv1alpha1.ReasonTokenizerNotFound)
		g.Expect(c.Message).To(ContainSubstring("keep their pod template and configuration revision " + cfg.Revision()))
	})
	t.Run("claim checked by the pods", func(t *testing.T) {
		g := NewWithT(t)
		cp := cp.DeepCopy()
		o := observed{pool: okPool, gateway: okGateway, pipeline: found[error](nil), applied: found(&cfg), deployment: found(deployment(1, nil)),
			podCheckedTokenizers: []string{"pipeline.steps[0].params.tokenizer (PersistentVolumeClaim models)"}}
		computeStatus(cp, o)
		c := expectCondition(g, cp, coordinatorv1alpha1.ConditionPipelineValid, metav1.ConditionTrue, coordinatorv1alpha1.ReasonValid)
		g.Expect(c.Message).To(Equal("all 4 steps build with their params; the tokenizer files of pipeline.steps[0].params.tokenizer (PersistentVolumeClaim models) " +
			"are on a volume the operator does not read: the coordinator pods check them when they load them (a pod that cannot shows in RolledOut)"))
	})
}

// The Deployment is left alone while the pipeline's tokenizer cannot be validated with its files,
// like for a refused image; other invalid pipelines still apply the pod settings.
func TestHoldsDeployment(t *testing.T) {
	for err, want := range map[error]bool{
		nil: false,
		&config.FieldError{Key: "pipeline.steps[1].params.max_parallel", Reason: "x"}:       false,
		&config.FieldError{Key: "pipeline.steps[0].params.tokenizer", Reason: "x"}:          true,
		&config.FieldError{Key: "canary.pipeline.steps[0].params.tokenizer", Reason: "x"}:   true,
		&config.FieldError{Key: "pipeline.steps[0].params.tokenizer_revision", Reason: "x"}: false,
		&tokenizerNotFoundError{configMap: "x"}:                                             true,
		&schemaError{image: "i"}:                                                            true,
	} {
		if got := holdsDeployment(err); got != want {
			t.Errorf("holdsDeployment(%v) = %v, want %v", err, got, want)
		}
	}
}

// A coordinator container that exits with an error is reported with the last line of its
// termination message (the end of its log with FallbackToLogsOnError).
func TestStartFailure(t *testing.T) {
	const log = `{"level":"info","msg":"starting coordinator"}
coordinator: invalid pipeline in /etc/coordinator/coordinator.yaml: pipeline.steps[0].params.tokenizer: open /var/run/coordinator/tokenizers/qwen/tokenizer.json: no such file or directory
`
	status := func(name string, restarts int32, last, now *corev1.ContainerStateTerminated) corev1.ContainerStatus {
		cs := corev1.ContainerStatus{Name: name, RestartCount: restarts}
		if last != nil {
			cs.LastTerminationState.Terminated = last
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}
		}
		if now != nil {
			cs.State = corev1.ContainerState{Terminated: now}
		}
		return cs
	}
	tests := map[string]struct {
		statuses []corev1.ContainerStatus
		want     string
	}{
		"crash looping": {statuses: []corev1.ContainerStatus{status(containerName, 3, &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: log}, nil)},
			want: "exits with code 1, restarted 3 times: coordinator: invalid pipeline in /etc/coordinator/coordinator.yaml: pipeline.steps[0].params.tokenizer: open /var/run/coordinator/tokenizers/qwen/tokenizer.json: no such file or directory"},
		"first exit, no message": {statuses: []corev1.ContainerStatus{status(containerName, 0, nil, &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"})},
			want: "exits with code 2"},
		"killed for memory": {statuses: []corev1.ContainerStatus{status(containerName, 1, &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"}, nil)},
			want: "exits with code 137 (OOMKilled), restarted 1 times"},
		"a long message is cut": {statuses: []corev1.ContainerStatus{status(containerName, 1, &corev1.ContainerStateTerminated{ExitCode: 1, Message: strings.Repeat("x", 400)}, nil)},
			want: "exits with code 1, restarted 1 times: " + strings.Repeat("x", rolloutErrorLen-3) + "..."},
		"exited cleanly":    {statuses: []corev1.ContainerStatus{status(containerName, 1, &corev1.ContainerStateTerminated{ExitCode: 0}, nil)}},
		"never terminated":  {statuses: []corev1.ContainerStatus{status(containerName, 0, nil, nil)}},
		"another container": {statuses: []corev1.ContainerStatus{status("sidecar", 3, &corev1.ContainerStateTerminated{ExitCode: 1}, nil)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(startFailure(&corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: tc.statuses}})).To(Equal(tc.want))
		})
	}
}

// The tokenizer ConfigMap cache keeps identity and version only: not labels, nor annotations such
// as kubectl's last-applied-configuration (a copy of the data).
func TestKeepIdentity(t *testing.T) {
	g := NewWithT(t)
	in := configMapMetadata()
	in.Name, in.Namespace, in.UID, in.ResourceVersion = "tok", "ns", "u", "7"
	in.Labels = map[string]string{"a": "b"}
	in.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 1000)}
	in.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	out, err := keepIdentity(in)
	g.Expect(err).NotTo(HaveOccurred())
	want := configMapMetadata()
	want.Name, want.Namespace, want.UID, want.ResourceVersion = "tok", "ns", "u", "7"
	g.Expect(out).To(Equal(want))
	other := &corev1.ConfigMap{}
	out, err = keepIdentity(other)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(out).To(BeIdenticalTo(other))
}
