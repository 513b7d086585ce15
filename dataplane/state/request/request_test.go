package request

import (
	"strings"
	"testing"
)

func TestTimings(t *testing.T) {
	rc := &Context{}
	rc.StartStep("render")
	if got := rc.EndStep("ok"); got.Step != "render" || got.Outcome != "ok" {
		t.Fatalf("EndStep = %+v", got)
	}
	rc.StartStep("conditional-decode")
	st := rc.ServerTiming()
	if !strings.HasPrefix(st, "render;dur=") || !strings.Contains(st, ", conditional_decode;dur=") {
		t.Fatalf("Server-Timing %q", st)
	}
	if kv := rc.TimingSummary(); len(kv) != 2 || kv[0] != "render" {
		t.Fatalf("summary %v", kv)
	}
}
