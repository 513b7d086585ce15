package observe

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMediaInFlightGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	held := int64(1234)
	reg.MustRegister(MediaInFlight(func() int64 { return held }))
	want := `
# HELP coordinator_media_inflight_bytes Media bytes held by requests in flight (downloads and inlined bodies of replace-media-urls).
# TYPE coordinator_media_inflight_bytes gauge
coordinator_media_inflight_bytes 1234
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "coordinator_media_inflight_bytes"); err != nil {
		t.Fatal(err)
	}
}

func TestResumeHeldGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	held := int64(4096)
	reg.MustRegister(ResumeHeld(func() int64 { return held }))
	want := `
# HELP coordinator_resume_held_bytes Bytes streams in flight keep to be resumed from if their decode worker fails (gateway.retry.max_resume_memory).
# TYPE coordinator_resume_held_bytes gauge
coordinator_resume_held_bytes 4096
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "coordinator_resume_held_bytes"); err != nil {
		t.Fatal(err)
	}
}
