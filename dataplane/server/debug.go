package server

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/reload"
)

// PipelineStatus is the JSON of GET /debug/pipeline.
type PipelineStatus struct {
	// Revision is the loaded configuration's fingerprint (the operator's status.configRevision).
	Revision string `json:"revision"`
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
	// Reload reports the config watcher (absent when the file is not watched).
	Reload *reload.Status `json:"reload,omitempty"`
}

func (s *Server) handleDebugPipeline(c echo.Context) error {
	p := s.holder.Load()
	if p == nil {
		return errNoPipeline()
	}
	cfg := p.Config()
	st := PipelineStatus{
		Revision: p.Revision(), LoadedAt: p.LoadedAt(), Steps: p.Steps(),
		KVConnector: cfg.Pipeline.KVConnector, ECConnector: cfg.Pipeline.ECConnector,
		UseOpenAIFormat: cfg.Pipeline.UseOpenAIFormat, Gateway: cfg.Gateway.Address,
	}
	if s.reloader != nil {
		rs := s.reloader.Status()
		st.Reload = &rs
	}
	return c.JSON(http.StatusOK, st)
}
