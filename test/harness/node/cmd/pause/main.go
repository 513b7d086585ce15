// Command pause is the node harness's pod sandbox image (registry.k8s.io/pause's job): it holds the
// pod's namespaces and waits for SIGTERM or SIGINT. No registry is reachable to pull the real one.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// Reap any child re-parented to us (we are PID 1 of the sandbox when the PID namespace is shared).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGCHLD)
	<-sig
}
