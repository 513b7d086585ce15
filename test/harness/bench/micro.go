package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// MicroResult is one line of `go test -bench -benchmem` output.
type MicroResult struct {
	// Name is the benchmark name without the -GOMAXPROCS suffix.
	Name       string  `json:"name"`
	Iterations int64   `json:"iterations"`
	NsPerOp    float64 `json:"ns_per_op"`
	MBPerS     float64 `json:"mb_per_s,omitempty"`
	BytesPerOp float64 `json:"bytes_per_op"`
	AllocsOp   float64 `json:"allocs_per_op"`
	// Extra holds custom metrics (b.ReportMetric), by unit.
	Extra map[string]float64 `json:"extra,omitempty"`
}

// RunMicro runs `go test -run '^$' -bench . -benchmem -benchtime <benchtime> <pkgs>` in repo,
// writes the raw output to outPath and returns the parsed benchmark lines.
func RunMicro(ctx context.Context, repo, benchtime, outPath string, pkgs []string) ([]MicroResult, error) {
	args := append([]string{"test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", benchtime}, pkgs...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repo
	out, err := cmd.CombinedOutput()
	if werr := os.WriteFile(outPath, out, 0o644); werr != nil && err == nil {
		err = werr
	}
	res := ParseMicro(out)
	if err != nil {
		return res, fmt.Errorf("go %s: %w (output in %s)", strings.Join(args, " "), err, outPath)
	}
	return res, nil
}

// ParseMicro extracts the benchmark lines of `go test -bench` output.
func ParseMicro(out []byte) []MicroResult {
	var res []MicroResult
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		iters, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		r := MicroResult{Name: trimProcs(f[0]), Iterations: iters}
		ok := true
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				ok = false
				break
			}
			switch unit := f[i+1]; unit {
			case "ns/op":
				r.NsPerOp = v
			case "MB/s":
				r.MBPerS = v
			case "B/op":
				r.BytesPerOp = v
			case "allocs/op":
				r.AllocsOp = v
			default:
				if r.Extra == nil {
					r.Extra = map[string]float64{}
				}
				r.Extra[unit] = v
			}
		}
		if ok {
			res = append(res, r)
		}
	}
	return res
}

// trimProcs drops the "-N" GOMAXPROCS suffix go test appends to benchmark names.
func trimProcs(name string) string {
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return name
	}
	if _, err := strconv.Atoi(name[i+1:]); err != nil {
		return name
	}
	return name[:i]
}
