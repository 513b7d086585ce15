// Package bench is the end-to-end benchmark harness of the coordinator (docs/benchmarks.md).
//
// It starts, as separate processes on loopback, an instant simworker, the one-hop raw proxy
// (test/harness/bench/rawproxy, the floor for any Go proxy) and the real coordinator binary with
// decode-only and prefill+decode pipelines, drives each with a closed-loop load generator
// (vegeta as a library: N workers, each sending its next request when the previous one has
// completed) and renders one report: throughput and latency per target × body × stream with the
// coordinator/raw-proxy ratios, the proxies' CPU time per request and peak RSS, the SSE per-event
// latency each hop adds, and the Go micro-benchmarks of the request path.
//
// The command is test/harness/bench/cmd/benchharness; `make bench` runs it.
package bench
