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

func TestTokenIDsJSON(t *testing.T) {
	rc := &Context{}
	rc.SetTokenIDs([]int{1, -2, 30})
	if got := string(rc.TokenIDsJSON()); got != "[1,-2,30]" {
		t.Fatalf("TokenIDsJSON = %s", got)
	}
	rc.SetTokenIDs(nil)
	if got := string(rc.TokenIDsJSON()); got != "[]" {
		t.Fatalf("TokenIDsJSON = %s", got)
	}
}
