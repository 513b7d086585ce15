// Package images_test checks the container images as far as they can be checked without a
// container engine: it parses Dockerfile and Dockerfile.coordinator, builds each binary with the
// Dockerfile's own `go build` command line (CGO_ENABLED=0, -trimpath, version -ldflags), checks the
// binaries are static and carry those settings, and runs them: both answer --help, and the
// coordinator serves /readyz with the annotated config/coordinator/coordinator.yaml, as the
// image's nonroot user (UID 65532) when the test runs as root.
package images_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const root = "../../.."

// dockerfile is the part of a Dockerfile this test understands.
type dockerfile struct {
	path string
	// args are the ARG defaults (first stage wins).
	args map[string]string
	// buildEnv and buildArgs are the `VAR=value ... go build ARGS` of the builder's RUN line,
	// unexpanded.
	buildEnv  map[string]string
	buildArgs []string
	// copies are the builder stage's `COPY src dst` sources.
	copies []string
	// final stage
	base, user  string
	finalCopies []string
	entrypoint  string
	cmd         string
}

// parseDockerfile reads the instructions this test checks: ARGs, the builder's COPY sources and
// its `go build` RUN line, and the final stage's FROM, USER, COPY, ENTRYPOINT and CMD.
func parseDockerfile(t *testing.T, name string) dockerfile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatal(err)
	}
	df := dockerfile{path: name, args: map[string]string{}, buildEnv: map[string]string{}}
	// Join continuation lines, drop comments.
	var instrs []string
	var cur string
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur == "") {
			continue
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur += strings.TrimSuffix(trimmed, `\`) + " "
			continue
		}
		instrs = append(instrs, cur+trimmed)
		cur = ""
	}
	stage := 0
	for _, in := range instrs {
		op, rest, _ := strings.Cut(in, " ")
		switch strings.ToUpper(op) {
		case "FROM":
			stage++
			fields := strings.Fields(rest)
			df.base = fields[len(fields)-1]
			if i := strings.Index(strings.ToUpper(rest), " AS "); i >= 0 {
				df.base = strings.Fields(rest[:i])[len(strings.Fields(rest[:i]))-1]
			}
		case "ARG":
			k, v, _ := strings.Cut(rest, "=")
			if _, seen := df.args[k]; !seen {
				df.args[k] = v
			}
		case "COPY":
			fields := strings.Fields(rest)
			if stage == 1 {
				df.copies = append(df.copies, fields[:len(fields)-1]...)
			} else {
				df.finalCopies = append(df.finalCopies, rest)
			}
		case "RUN":
			if i := strings.Index(rest, "go build "); i >= 0 {
				for _, w := range strings.Fields(rest[:i]) {
					if k, v, ok := strings.Cut(w, "="); ok && !strings.HasPrefix(w, "--") {
						df.buildEnv[k] = v
					}
				}
				df.buildArgs = shellWords(t, rest[i+len("go build "):])
			}
		case "USER":
			df.user = rest
		case "ENTRYPOINT":
			df.entrypoint = rest
		case "CMD":
			df.cmd = rest
		}
	}
	if len(df.buildArgs) == 0 {
		t.Fatalf("%s: no RUN ... go build line", name)
	}
	return df
}

var argRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// expand substitutes ${VAR} and $VAR from vars, failing on an unknown variable.
func expand(t *testing.T, s string, vars map[string]string) string {
	t.Helper()
	return argRef.ReplaceAllStringFunc(s, func(ref string) string {
		m := argRef.FindStringSubmatch(ref)
		name := m[1] + m[2]
		v, ok := vars[name]
		if !ok {
			t.Fatalf("%q uses $%s, which the test does not set", s, name)
		}
		return v
	})
}

// shellWords splits a RUN command's arguments: whitespace and double quotes.
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var words []string
	var cur strings.Builder
	inQuote, inWord := false, false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote, inWord = !inQuote, true
		case (r == ' ' || r == '\t') && !inQuote:
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inQuote {
		t.Fatalf("unterminated quote in %q", s)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// flagValue returns the value of a `-flag value` pair in args.
func flagValue(args []string, flag string) (string, bool) {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

func hasFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == flag || a == flag+"=true" {
			return true
		}
	}
	return false
}

func (df dockerfile) String() string {
	return fmt.Sprintf("%s (go build %s)", df.path, strings.Join(df.buildArgs, " "))
}
