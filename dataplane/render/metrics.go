package render

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
)

// collector reports the segment caches of the models loaded now.
type collector struct {
	hits, misses, bytes                         *prometheus.Desc
	histHits, histMisses, histTokens, histBytes *prometheus.Desc
	strHits, strMisses                          *prometheus.Desc
	msgHits, msgMisses                          *prometheus.Desc
	itReplayed, itRan                           *prometheus.Desc
}

// Collector exports the in-process renderer's caches of encoded text, per tokenizer directory:
// <namespace>_render_cache_hits_total and _misses_total (segments looked up: a multi-turn
// conversation's history should hit) and _render_cache_bytes (held); and its rendered-history
// caches: <namespace>_render_history_hits_total and _misses_total (chat renders that reused a
// cached conversation's ids, and those that found none to reuse), _render_history_tokens_total
// (the ids reused), _render_history_messages_hits_total and _misses_total (messages found
// decoded into the template's values, and decoded), _render_history_strings_hits_total and
// _misses_total (long message strings found decoded, and decoded),
// _render_history_iterations_replayed_total and _run_total (iterations of the template's loops
// over messages replayed from an earlier turn, and run) and _render_history_bytes (held, the
// decoded messages and strings and the iterations included). A
// model loaded again (its files changed) starts its counts from zero.
func Collector(namespace string) prometheus.Collector {
	labels := []string{"tokenizer"}
	return &collector{
		hits: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_cache", "hits_total"),
			"Segments of rendered prompts (text between special tokens) found in the in-process renderer's cache.", labels, nil),
		misses: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_cache", "misses_total"),
			"Segments of rendered prompts encoded because the cache did not hold them.", labels, nil),
		bytes: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_cache", "bytes"),
			"Bytes the in-process renderer's cache holds (segment text and ids).", labels, nil),
		histHits: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_history", "hits_total"),
			"Chat renders that reused the ids of a conversation rendered before (its history).", labels, nil),
		histMisses: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_history", "misses_total"),
			"Chat renders with the history cache on that found no rendered history to reuse.", labels, nil),
		histTokens: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_history", "tokens_total"),
			"Token ids taken from the rendered-history cache instead of encoded.", labels, nil),
		histBytes: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_history", "bytes"),
			"Bytes the rendered-history cache holds (rendered text, ids, decoded messages and strings, template iterations, bookkeeping).", labels, nil),
		msgHits: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_history", "messages_hits_total"),
			"Chat messages found decoded into the template's values in the rendered-history cache.", labels, nil),
		msgMisses: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_history", "messages_misses_total"),
			"Chat messages decoded because the rendered-history cache did not hold them (none while the template may change its inputs).", labels, nil),
		strHits: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_history", "strings_hits_total"),
			"Long message strings (with escapes) found decoded in the rendered-history cache.", labels, nil),
		strMisses: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_history", "strings_misses_total"),
			"Long message strings (with escapes) decoded because the rendered-history cache did not hold them.", labels, nil),
		itReplayed: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_history", "iterations_replayed_total"),
			"Iterations of the chat template's loops over messages replayed from an earlier turn (everything they read unchanged).", labels, nil),
		itRan: prometheus.NewDesc(prometheus.BuildFQName(namespace, "render_history", "iterations_run_total"),
			"Iterations of the chat template's loops over messages run (new, changed, or not to be kept).", labels, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.hits
	ch <- c.misses
	ch <- c.bytes
	ch <- c.histHits
	ch <- c.histMisses
	ch <- c.histTokens
	ch <- c.histBytes
	ch <- c.strHits
	ch <- c.strMisses
	ch <- c.msgHits
	ch <- c.msgMisses
	ch <- c.itReplayed
	ch <- c.itRan
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	loaded.mu.Lock()
	models := make([]*Model, 0, len(loaded.m))
	for _, m := range loaded.m {
		if m.cache != nil || m.history != nil {
			models = append(models, m)
		}
	}
	loaded.mu.Unlock()
	// One series per directory: several models of one directory (other options) add up.
	type sums struct {
		cache, history                         bool
		hits, misses, bytes                    float64
		histHits, histMisses, histTok, histByt float64
		strHits, strMisses                     float64
		msgHits, msgMisses                     float64
		itReplayed, itRan                      float64
	}
	byDir := map[string]*sums{}
	for _, m := range models {
		s := byDir[m.dir]
		if s == nil {
			s = &sums{}
			byDir[m.dir] = s
		}
		if m.cache != nil {
			h, mi, b := m.cache.Stats()
			s.cache = true
			s.hits, s.misses, s.bytes = s.hits+float64(h), s.misses+float64(mi), s.bytes+float64(b)
		}
		if m.history != nil {
			h, mi, tk, b := m.HistoryStats()
			s.history = true
			s.histHits, s.histMisses, s.histTok, s.histByt = s.histHits+float64(h), s.histMisses+float64(mi), s.histTok+float64(tk), s.histByt+float64(b)
			mh, mm, sh, sm := m.DecodedStats()
			s.msgHits, s.msgMisses = s.msgHits+float64(mh), s.msgMisses+float64(mm)
			s.strHits, s.strMisses = s.strHits+float64(sh), s.strMisses+float64(sm)
			ir, irun := m.IterationStats()
			s.itReplayed, s.itRan = s.itReplayed+float64(ir), s.itRan+float64(irun)
		}
	}
	dirs := make([]string, 0, len(byDir))
	for d := range byDir {
		dirs = append(dirs, d)
	}
	slices.Sort(dirs)
	for _, d := range dirs {
		s := byDir[d]
		if s.cache {
			ch <- prometheus.MustNewConstMetric(c.hits, prometheus.CounterValue, s.hits, d)
			ch <- prometheus.MustNewConstMetric(c.misses, prometheus.CounterValue, s.misses, d)
			ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, s.bytes, d)
		}
		if s.history {
			ch <- prometheus.MustNewConstMetric(c.histHits, prometheus.CounterValue, s.histHits, d)
			ch <- prometheus.MustNewConstMetric(c.histMisses, prometheus.CounterValue, s.histMisses, d)
			ch <- prometheus.MustNewConstMetric(c.histTokens, prometheus.CounterValue, s.histTok, d)
			ch <- prometheus.MustNewConstMetric(c.histBytes, prometheus.GaugeValue, s.histByt, d)
			ch <- prometheus.MustNewConstMetric(c.strHits, prometheus.CounterValue, s.strHits, d)
			ch <- prometheus.MustNewConstMetric(c.strMisses, prometheus.CounterValue, s.strMisses, d)
			ch <- prometheus.MustNewConstMetric(c.msgHits, prometheus.CounterValue, s.msgHits, d)
			ch <- prometheus.MustNewConstMetric(c.msgMisses, prometheus.CounterValue, s.msgMisses, d)
			ch <- prometheus.MustNewConstMetric(c.itReplayed, prometheus.CounterValue, s.itReplayed, d)
			ch <- prometheus.MustNewConstMetric(c.itRan, prometheus.CounterValue, s.itRan, d)
		}
	}
}
