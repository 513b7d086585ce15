package observe

import (
	"github.com/prometheus/client_golang/prometheus"
)

// MediaInFlight is the gauge of the media bytes that requests in flight hold in the process
// (downloaded, or inlined into their bodies, by replace-media-urls: its process-wide budget,
// whose count held reads).
func MediaInFlight(held func() int64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "media_inflight_bytes",
		Help: "Media bytes held by requests in flight (downloads and inlined bodies of replace-media-urls)."},
		func() float64 { return float64(held()) })
}

// RenderInFlight is the gauge of the bytes in-process renders hold for requests in flight: while
// a request renders, its estimated peak; after, its token ids (render's process-wide budget,
// whose count held reads).
func RenderInFlight(held func() int64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "render_inflight_bytes",
		Help: "Bytes held by in-process renders of requests in flight (estimated while rendering, then their token ids)."},
		func() float64 { return float64(held()) })
}

// ResumeHeld is the gauge of the bytes streams in flight keep to be resumed from (the budget of
// gateway.retry.max_resume_memory, whose count held reads).
func ResumeHeld(held func() int64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "resume_held_bytes",
		Help: "Bytes streams in flight keep to be resumed from if their decode worker fails (gateway.retry.max_resume_memory)."},
		func() float64 { return float64(held()) })
}

// Media modalities (coordinator_media_items_total's modality label, vLLM's feature keys).
const (
	ModalityImage = "image"
	ModalityAudio = "audio"
	ModalityVideo = "video"
)

// Media sources (coordinator_media_items_total's source label).
const (
	// MediaDownloaded items were fetched from a media host by replace-media-urls.
	MediaDownloaded = "download"
	// MediaInline items came in the request (a data: URL, input_audio data).
	MediaInline = "inline"
)

// newMediaItems is coordinator_media_items_total.
func newMediaItems() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "media_items_total",
		Help: "Media items replace-media-urls accepted, by modality (image, audio, video) and source (download, inline)."},
		[]string{"modality", "source"})
}

// MediaItem counts one media item replace-media-urls accepted: modality is ModalityImage,
// ModalityAudio or ModalityVideo, source MediaDownloaded or MediaInline.
func (m *Metrics) MediaItem(modality, source string) {
	if m != nil {
		m.mediaItems.WithLabelValues(modality, source).Inc()
	}
}
