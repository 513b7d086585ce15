package render

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// collector reports the segment caches of the models loaded now.
type collector struct {
	hits, misses, bytes *prometheus.Desc
}

// Collector exports the in-process renderer's caches of encoded text, per tokenizer directory:
// <namespace>_render_cache_hits_total and _misses_total (segments looked up: a multi-turn
// conversation's history should hit) and _render_cache_bytes (held). A model loaded again (its
// files changed) starts its counts from zero.
func Collector(namespace string) prometheus.Collector {
	labels := []string{"tokenizer"}
	return &collector{
		hits: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_cache", "hits_total"),
			"Segments of rendered prompts (text between special tokens) found in the in-process renderer's cache.", labels, nil),
		misses: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_cache", "misses_total"),
			"Segments of rendered prompts encoded because the cache did not hold them.", labels, nil),
		bytes: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_cache", "bytes"),
			"Bytes the in-process renderer's cache holds (segment text and ids).", labels, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.hits
	ch <- c.misses
	ch <- c.bytes
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	loaded.mu.Lock()
	models := make([]*Model, 0, len(loaded.m))
	for _, m := range loaded.m {
		if m.cache != nil {
			models = append(models, m)
		}
	}
	loaded.mu.Unlock()
	// One series per directory: several models of one directory (other options) add up.
	type sums struct{ hits, misses, bytes float64 }
	byDir := map[string]*sums{}
	for _, m := range models {
		h, mi, b := m.cache.Stats()
		s := byDir[m.dir]
		if s == nil {
			s = &sums{}
			byDir[m.dir] = s
		}
		s.hits, s.misses, s.bytes = s.hits+float64(h), s.misses+float64(mi), s.bytes+float64(b)
	}
	dirs := make([]string, 0, len(byDir))
	for d := range byDir {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		s := byDir[d]
		ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, s.hits, d)
		ch <- prometheus.MustNewConstMetric(c.misses, prometheus.CounterValue, s.misses, d)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, s.bytes, d)
	}
}
