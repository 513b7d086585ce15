package packaging

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// InstallDoc is the installation guide whose commands the packaging tests run.
const InstallDoc = "docs/install.md"

// DocCommand returns the first command line of docs/install.md that starts with prefix, its
// continuation lines (trailing backslash) joined, split into words as sh would split them
// (single and double quotes, comments; no expansions). Tests use it to run what the guide tells
// users to run.
func DocCommand(root, prefix string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(root, InstallDoc))
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(data), "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		cmd := l
		for strings.HasSuffix(cmd, `\`) && i+1 < len(lines) {
			i++
			cmd = strings.TrimSuffix(cmd, `\`) + " " + strings.TrimSpace(lines[i])
		}
		return shellWords(cmd)
	}
	return nil, fmt.Errorf("%s has no line starting with %q", InstallDoc, prefix)
}

func shellWords(s string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'' || c == '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unterminated quote in %q", s)
			}
			cur.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '#' && !inWord:
			i = len(s)
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}
