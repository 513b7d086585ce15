// Command bundlegen writes the OLM registry+v1 bundle (bundle/, bundle.Dockerfile) from
// config/manifests (the base CSV, config/default and the samples). It stands in for
// `operator-sdk generate bundle`, which is not available here. `make bundle`.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/epd-dev/coordinator/internal/packaging"
)

func main() {
	var opts packaging.BundleOptions
	root := flag.String("root", ".", "repository root")
	flag.StringVar(&opts.Version, "version", "", "operator version (semver, no leading v)")
	flag.StringVar(&opts.OperatorImage, "image", "", "operator (manager) image")
	flag.StringVar(&opts.CoordinatorImage, "coordinator-image", "", "default coordinator image")
	channels := flag.String("channels", "candidate", "comma-separated OLM channels")
	flag.StringVar(&opts.DefaultChannel, "default-channel", "candidate", "default OLM channel")
	flag.Parse()
	opts.Channels = strings.Split(*channels, ",")

	files, err := packaging.Bundle(*root, opts)
	if err == nil {
		err = packaging.WriteFiles(*root, files, true)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bundlegen:", err)
		os.Exit(1)
	}
}
