// Command tcpfront runs a program and forwards TCP connections from --listen to --to. The node
// harness packs it with llm-d's vLLM simulator, which (as shipped to this project) listens on
// 127.0.0.1 only: inside a pod that is the pod's loopback, which neither a Service nor the kubelet's
// readiness probe reaches, so tcpfront listens on the pod's address and forwards to it.
//
//	tcpfront --listen :8000 --to 127.0.0.1:8001 -- /llm-d-inference-sim --port 8001 ...
//
// SIGTERM and SIGINT are passed to the program; tcpfront exits with the program's status.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

func main() {
	listen := flag.String("listen", ":8000", "address to accept connections on")
	to := flag.String("to", "127.0.0.1:8001", "address to forward each connection to")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "tcpfront: no program to run")
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tcpfront:", err)
		os.Exit(1)
	}
	cmd := exec.Command(flag.Arg(0), flag.Args()[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "tcpfront:", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range sig {
			_ = cmd.Process.Signal(s)
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go forward(c, *to)
		}
	}()
	err = cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		os.Exit(exit.ExitCode())
	}
	if err != nil {
		os.Exit(1)
	}
}

// forward copies both ways between c and a new connection to addr, closing each side's write
// half when the other's read ends.
func forward(c net.Conn, addr string) {
	defer c.Close()
	u, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
	<-done
}
