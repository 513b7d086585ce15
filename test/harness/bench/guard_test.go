package bench

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSliceNoise(t *testing.T) {
	if got := SliceNoise([]float64{0.5}); got != 0 {
		t.Errorf("one slice: %v, want 0", got)
	}
	// mean 0.6, sample standard deviation sqrt(0.02/3), over sqrt(4).
	got := SliceNoise([]float64{0.5, 0.6, 0.6, 0.7})
	if want := math.Sqrt(0.02/3) / 2; math.Abs(got-want) > 1e-12 {
		t.Errorf("SliceNoise = %v, want %v", got, want)
	}
	if got := AllowedDrop(0.001, 0.001); got != GuardFloor {
		t.Errorf("quiet runs: allowed %v, want the floor %v", got, GuardFloor)
	}
	if got, want := AllowedDrop(0.03, 0.04), 0.1; math.Abs(got-want) > 1e-12 {
		t.Errorf("noisy runs: allowed %v, want %v", got, want)
	}
}

// TestFillRatiosSlices: each slice is divided by the raw proxy's slice of the same round.
func TestFillRatiosSlices(t *testing.T) {
	res := []CellResult{
		{Cell: Cell{Target: TargetRaw, Body: Body1MiB}, RPS: 100, SliceRPS: []float64{100, 200}},
		{Cell: Cell{Target: TargetPrefillDecode, Body: Body1MiB}, RPS: 60, SliceRPS: []float64{50, 140}},
		{Cell: Cell{Target: TargetDecodeOnly, Body: Body1MiB}, RPS: 60, SliceRPS: []float64{50}}, // slices do not pair
	}
	FillRatios(res)
	if got := res[1].SliceRatios; len(got) != 2 || got[0] != 0.5 || got[1] != 0.7 {
		t.Errorf("slice ratios %v, want [0.5 0.7]", got)
	}
	if res[2].SliceRatios != nil {
		t.Errorf("unpaired slices gave ratios %v", res[2].SliceRatios)
	}
}

// TestGuard: a baseline written from one run flags the same cells of a later run only when
// they drop by more than the allowed noise, and compares nothing at another concurrency.
func TestGuard(t *testing.T) {
	cell := func(target, body string, ratio float64, slices ...float64) CellResult {
		return CellResult{Cell: Cell{Target: target, Body: body}, RatioToRaw: ratio, SliceRatios: slices}
	}
	before := []CellResult{
		cell(TargetRaw, Body1MiB, 1),
		cell(TargetPrefillDecode, Body1MiB, 0.80, 0.79, 0.80, 0.80, 0.81),
		cell(TargetPrefillDecode, Body256K, 0.70, 0.70, 0.70, 0.70, 0.70),
		cell(TargetDecodeOnly, Body1MiB, 1.00, 0.90, 1.10, 0.95, 1.05),
	}
	base := NewBaseline(before, "abc1234", "2 CPUs", 16, time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
	if len(base.Cells) != 3 {
		t.Fatalf("baseline cells %v: want the three coordinator cells", base.Cells)
	}
	path := filepath.Join(t.TempDir(), "baseline.json")
	if err := WriteBaseline(path, base); err != nil {
		t.Fatal(err)
	}
	read, err := ReadBaseline(path)
	if err != nil {
		t.Fatal(err)
	}
	after := []CellResult{
		cell(TargetPrefillDecode, Body1MiB, 0.55, 0.54, 0.55, 0.55, 0.56), // the drop: flagged
		cell(TargetPrefillDecode, Body256K, 0.67, 0.66, 0.67, 0.67, 0.68), // within the floor
		cell(TargetDecodeOnly, Body1MiB, 0.88, 0.70, 1.05, 0.80, 0.97),    // within both runs' noise
	}
	checks := Guard(read, after, 16)
	if len(checks) != 3 {
		t.Fatalf("checks %+v: want 3", checks)
	}
	got := Regressions(checks)
	if len(got) != 1 || !strings.HasPrefix(got[0], "prefill-decode/1MiB-image/json ×raw 0.800 → 0.550") {
		t.Errorf("regressions %q: want prefill-decode/1MiB-image/json alone", got)
	}
	if c := Guard(read, after, 32); c != nil {
		t.Errorf("another concurrency compared: %+v", c)
	}
	var md strings.Builder
	writeGuard(&md, &read, checks)
	if !strings.Contains(md.String(), "| prefill-decode/1MiB-image/json | 0.800 | 0.550 | -0.250 |") || !strings.Contains(md.String(), "**REGRESSED**") {
		t.Errorf("guard table:\n%s", md.String())
	}
}
