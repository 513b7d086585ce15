package chattemplate

import (
	"math"
	"testing"
)

func TestPyFloatRepr(t *testing.T) {
	for _, tc := range []struct {
		f    float64
		want string
	}{
		{1, "1.0"}, {0.5, "0.5"}, {-2.25, "-2.25"}, {0.30000000000000004, "0.30000000000000004"},
		{1e15, "1000000000000000.0"}, {1e16, "1e+16"}, {1.5e16, "1.5e+16"}, {123456789012345.6, "123456789012345.6"},
		{0.0001, "0.0001"}, {0.00001, "1e-05"}, {1.5e-7, "1.5e-07"}, {1e100, "1e+100"}, {5e-324, "5e-324"},
		{math.Copysign(0, -1), "-0.0"}, {math.NaN(), "NaN"}, {math.Inf(1), "Infinity"}, {math.Inf(-1), "-Infinity"},
	} {
		if got := pyFloatRepr(tc.f, true); got != tc.want {
			t.Errorf("pyFloatRepr(%v) = %q, want %q", tc.f, got, tc.want)
		}
	}
	if got := pyFloatRepr(math.Inf(-1), false); got != "-inf" {
		t.Errorf("str(-inf) = %q", got)
	}
}
