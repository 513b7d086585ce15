// Command chartgen writes the generated files of the Helm chart (charts/coordinator-operator: the
// CRD and RBAC templates and the monitoring files from kustomize's output of config/, and the
// README's values table from values.yaml). `make helm-chart`.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/epd-dev/coordinator/internal/packaging"
)

func main() {
	root := flag.String("root", ".", "repository root")
	flag.Parse()
	files, err := packaging.ChartFiles(*root)
	if err == nil {
		prefixed := map[string][]byte{}
		for rel, data := range files {
			prefixed[filepath.ToSlash(filepath.Join(packaging.ChartDir, rel))] = data
		}
		err = packaging.WriteFiles(*root, prefixed, false)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chartgen:", err)
		os.Exit(1)
	}
}
