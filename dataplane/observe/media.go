package observe

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// MediaInFlight is the number of media bytes that requests in flight hold in this process
// (downloaded, or inlined into their bodies, by replace-media-urls: its process-wide budget).
var MediaInFlight atomic.Int64

// newMediaInFlight is the gauge reporting MediaInFlight.
func newMediaInFlight() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "media_inflight_bytes",
		Help: "Media bytes held by requests in flight (downloads and inlined bodies of replace-media-urls)."},
		func() float64 { return float64(MediaInFlight.Load()) })
}
