package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// The regression guard (issue 34): prefill+decode lost a third of its rate at large bodies and
// nothing said so, because the targets are absolute bounds a cell can fail for other reasons
// (and had failed for long) and nothing compared a run with the one before. The guard keeps,
// per coordinator cell, the as-run ratio to the raw proxy of a reference run (the baseline,
// checked in) and flags a cell whose ratio now is lower by more than the noise of the two runs.

// Baseline is a stored reference run: per coordinator cell, its ratios to the raw proxy.
type Baseline struct {
	// Revision, Date, Machine and Concurrency say what run the figures come from.
	Revision    string `json:"revision"`
	Date        string `json:"date"`
	Machine     string `json:"machine"`
	Concurrency int    `json:"concurrency"`
	// Note says anything a reader of the figures should know (how quiet the machine was).
	Note string `json:"note,omitempty"`
	// Cells are keyed by Cell.String() ("prefill-decode/1MiB-image/json").
	Cells map[string]BaselineCell `json:"cells"`
}

// BaselineCell is one cell of a baseline.
type BaselineCell struct {
	// Ratio is RatioToRaw; Noise the standard error of the mean of its per-slice ratios.
	Ratio float64 `json:"ratio_to_raw"`
	Noise float64 `json:"noise"`
	// CPURatio is CPURatioToRaw (the proxy-bound ratio), shown beside the verdict.
	CPURatio float64 `json:"cpu_ratio_to_raw,omitempty"`
}

// GuardFloor is the smallest drop of a ratio to the raw proxy the guard flags, whatever the
// per-slice noise says: 4 slices of 2 s are few, and the raw proxy's own rate moves between runs.
const GuardFloor = 0.05

// GuardCheck is one cell's comparison with the baseline.
type GuardCheck struct {
	Cell string `json:"cell"`
	// Baseline and Now are the as-run ratios to the raw proxy; BaselineCPU and NowCPU the
	// proxy-bound ones (CPURatioToRaw), shown, not judged.
	Baseline    float64 `json:"ratio_baseline"`
	Now         float64 `json:"ratio_now"`
	BaselineCPU float64 `json:"cpu_ratio_baseline,omitempty"`
	NowCPU      float64 `json:"cpu_ratio_now,omitempty"`
	// Allowed is the drop the noise allows (AllowedDrop); Regressed: Baseline - Now > Allowed.
	Allowed   float64 `json:"allowed_drop"`
	Regressed bool    `json:"regressed"`
}

// SliceNoise is the standard error of the mean of ratios (0 with fewer than two).
func SliceNoise(ratios []float64) float64 {
	n := float64(len(ratios))
	if n < 2 {
		return 0
	}
	var sum, sq float64
	for _, r := range ratios {
		sum += r
	}
	mean := sum / n
	for _, r := range ratios {
		sq += (r - mean) * (r - mean)
	}
	return math.Sqrt(sq/(n-1)) / math.Sqrt(n)
}

// AllowedDrop is how far a ratio may fall below its baseline before the guard flags it: twice
// the combined noise of the two runs, and at least GuardFloor.
func AllowedDrop(baseNoise, nowNoise float64) float64 {
	return max(GuardFloor, 2*math.Hypot(baseNoise, nowNoise))
}

// NewBaseline makes a baseline of the coordinator cells of results (ratios filled).
func NewBaseline(results []CellResult, revision, machine string, concurrency int, started time.Time) Baseline {
	b := Baseline{Revision: revision, Date: started.UTC().Format("2006-01-02"), Machine: machine, Concurrency: concurrency,
		Cells: map[string]BaselineCell{}}
	for _, r := range results {
		if IsCoordinator(r.Target) && r.RatioToRaw > 0 && r.Errors == 0 {
			b.Cells[r.String()] = BaselineCell{Ratio: round3(r.RatioToRaw), Noise: round3(SliceNoise(r.SliceRatios)), CPURatio: round3(r.CPURatioToRaw)}
		}
	}
	return b
}

func round3(f float64) float64 { return math.Round(f*1000) / 1000 }

// Guard compares the coordinator cells of results with base, in the order of results. A cell the
// baseline lacks, or one run at another concurrency, is not compared.
func Guard(base Baseline, results []CellResult, concurrency int) []GuardCheck {
	if base.Concurrency != 0 && base.Concurrency != concurrency {
		return nil
	}
	var out []GuardCheck
	for _, r := range results {
		b, ok := base.Cells[r.String()]
		if !ok || !IsCoordinator(r.Target) || r.RatioToRaw <= 0 {
			continue
		}
		c := GuardCheck{Cell: r.String(), Baseline: b.Ratio, Now: r.RatioToRaw, BaselineCPU: b.CPURatio, NowCPU: r.CPURatioToRaw,
			Allowed: AllowedDrop(b.Noise, SliceNoise(r.SliceRatios))}
		c.Regressed = b.Ratio-r.RatioToRaw > c.Allowed
		out = append(out, c)
	}
	return out
}

// ReadBaseline reads a baseline file.
func ReadBaseline(path string) (Baseline, error) {
	var b Baseline
	data, err := os.ReadFile(path)
	if err != nil {
		return b, err
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return b, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}

// WriteBaseline writes b to path, cells in order.
func WriteBaseline(path string, b Baseline) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// writeGuard renders the guard's table.
func writeGuard(w io.Writer, base *Baseline, checks []GuardCheck) {
	if base == nil {
		return
	}
	fmt.Fprintln(w, "### Regression guard")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Each coordinator cell's `×raw` against the stored baseline (%s, %s, concurrency %d%s). A cell is flagged when its ratio is lower than the baseline's by more than twice the two runs' combined noise (the standard error of each run's per-slice ratios) and at least %.2f.\n\n",
		orDash(base.Revision), orDash(base.Date), base.Concurrency, noteSuffix(base.Note), GuardFloor)
	if len(checks) == 0 {
		fmt.Fprintln(w, "No cell compared (none measured that the baseline has, or another concurrency).")
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintln(w, "| cell | ×raw baseline | ×raw now | change | allowed drop | CPU ×raw baseline → now | verdict |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|:-:|")
	for _, c := range checks {
		verdict := "ok"
		if c.Regressed {
			verdict = "**REGRESSED**"
		}
		cpu := "—"
		if c.BaselineCPU > 0 && c.NowCPU > 0 {
			cpu = fmt.Sprintf("%.3f → %.3f", c.BaselineCPU, c.NowCPU)
		}
		fmt.Fprintf(w, "| %s | %.3f | %.3f | %+.3f | %.3f | %s | %s |\n", c.Cell, c.Baseline, c.Now, c.Now-c.Baseline, c.Allowed, cpu, verdict)
	}
	fmt.Fprintln(w)
}

func noteSuffix(note string) string {
	if note == "" {
		return ""
	}
	return "; " + strings.TrimSuffix(note, ".")
}

// Regressions lists the flagged cells.
func Regressions(checks []GuardCheck) []string {
	var out []string
	for _, c := range checks {
		if c.Regressed {
			out = append(out, fmt.Sprintf("%s ×raw %.3f → %.3f (allowed drop %.3f)", c.Cell, c.Baseline, c.Now, c.Allowed))
		}
	}
	return slices.Clip(out)
}
