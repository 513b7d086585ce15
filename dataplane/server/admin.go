package server

import (
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/reload"
	"github.com/epd-dev/coordinator/dataplane/server/conn"
)

// PipelineStatus is the JSON of GET /debug/pipeline.
type PipelineStatus struct {
	// Revision is the loaded configuration's fingerprint (the operator's status.configRevision).
	Revision string `json:"revision"`
	// ConfigSchema is the configuration schema this coordinator reads (config.SchemaVersion).
	ConfigSchema int `json:"config_schema"`
	// LoadedAt is when the serving pipeline was built.
	LoadedAt time.Time `json:"loaded_at"`
	// KVConnector, ECConnector and UseOpenAIFormat are the pipeline-level settings.
	KVConnector     string `json:"kv_connector"`
	ECConnector     string `json:"ec_connector"`
	UseOpenAIFormat bool   `json:"use_openai_format"`
	// Gateway is the gateway address.
	Gateway string `json:"gateway"`
	// Steps are the steps in order with their effective params.
	Steps []pipeline.StepInfo `json:"steps"`
	// Pipelines are the pipelines that serve requests: the stable one and, with a canary, the
	// canary, each with its share and what it served.
	Pipelines []PipelineTrack `json:"pipelines"`
	// Reload reports the config watcher (absent when the file is not watched).
	Reload *reload.Status `json:"reload,omitempty"`
}

// PipelineTrack is one serving pipeline in GET /debug/pipeline.
type PipelineTrack struct {
	// Track is stable or canary.
	Track string `json:"track"`
	// Revision is the pipeline block's revision (config.Pipeline.Revision), the one its legs carry.
	Revision string `json:"revision"`
	// WeightPercent is its share of the requests.
	WeightPercent int `json:"weight_percent"`
	// Requests and Errors count the requests run on the revision since this process loaded it,
	// and those that failed (a 5xx, or a response cut off).
	Requests uint64 `json:"requests"`
	Errors   uint64 `json:"errors"`
	// Steps are the canary's steps (the stable pipeline's are PipelineStatus.Steps).
	Steps []pipeline.StepInfo `json:"steps,omitempty"`
}

// StatusReporter reports the config watcher (reload.Watcher).
type StatusReporter interface{ Status() reload.Status }

// AdminHandler serves the admin endpoints, which the serving listener does not: GET /metrics
// (g in the Prometheus exposition format) and GET /debug/pipeline (the loaded pipeline, and the
// watcher when reloader is not nil). Anything else is a JSON 404 or 405.
func AdminHandler(g prometheus.Gatherer, holder *pipeline.Holder, reloader StatusReporter) http.Handler {
	routes := map[string]http.Handler{
		"/metrics":        promhttp.HandlerFor(g, promhttp.HandlerOpts{}),
		"/debug/pipeline": debugPipeline(holder, reloader),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := conn.RequestID(r.Header.Get("X-Request-Id"))
		w.Header().Set("X-Request-Id", id)
		h, ok := routes[r.URL.Path]
		switch {
		case !ok:
			apierror.Write(w, &apierror.Error{Status: http.StatusNotFound, Type: apierror.TypeNotFound, Code: "not_found",
				Message: "no such route on the admin listener (GET /metrics, GET /debug/pipeline)"}, id)
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			w.Header().Set("Allow", "GET, HEAD")
			apierror.Write(w, &apierror.Error{Status: http.StatusMethodNotAllowed, Type: apierror.TypeInvalidRequest,
				Code: "method_not_allowed", Message: "method not allowed on this route"}, id)
		default:
			h.ServeHTTP(w, r)
		}
	})
}

func debugPipeline(holder *pipeline.Holder, reloader StatusReporter) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := holder.Load()
		if p == nil {
			apierror.Write(w, errNoPipeline(), w.Header().Get("X-Request-Id"))
			return
		}
		cfg := p.Config()
		st := PipelineStatus{
			Revision: p.Revision(), ConfigSchema: config.SchemaVersion, LoadedAt: p.LoadedAt(), Steps: p.Steps(),
			KVConnector: cfg.Pipeline.KVConnector, ECConnector: cfg.Pipeline.ECConnector,
			UseOpenAIFormat: cfg.Pipeline.UseOpenAIFormat, Gateway: cfg.Gateway.Address,
		}
		for _, q := range p.Serving() {
			n, errs := q.Tally().Counts()
			pt := PipelineTrack{Track: q.Track(), Revision: q.PipelineRevision(), WeightPercent: q.WeightPercent, Requests: n, Errors: errs}
			if q.Pipeline != p {
				pt.Steps = q.Steps()
			}
			st.Pipelines = append(st.Pipelines, pt)
		}
		if reloader != nil {
			rs := reloader.Status()
			st.Reload = &rs
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
}

// Admin is the admin listener's server (see AdminHandler), with the serving listener's
// connection handling (see Server.Serve).
type Admin struct {
	http *http.Server
	tls  *tls.Config
	log  logr.Logger
}

// NewAdmin serves h; tlsConfig, when set, serves it over HTTPS (see TLSConfig).
func NewAdmin(h http.Handler, tlsConfig *tls.Config, log logr.Logger) *Admin {
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	hs := conn.NewHTTPServer(conn.Guard(h, log), log)
	hs.ReadTimeout, hs.WriteTimeout = 30*time.Second, time.Minute
	return &Admin{http: hs, tls: tlsConfig, log: log}
}

// Serve accepts connections on l until Close.
func (a *Admin) Serve(l net.Listener) error { return conn.Serve(a.http, l, a.tls, a.log) }

// Close closes the listener and every connection.
func (a *Admin) Close() error { return a.http.Close() }
