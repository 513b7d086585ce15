package server_test

import (
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/reload"
	"github.com/epd-dev/coordinator/dataplane/server"
	"github.com/epd-dev/coordinator/dataplane/server/conn"
)

type fixedStatus reload.Status

func (s fixedStatus) Status() reload.Status { return reload.Status(s) }

// startAdmin serves the admin endpoints of holder on loopback, over TLS when tc is set.
func startAdmin(t *testing.T, holder *pipeline.Holder, reloader server.StatusReporter, tc *tls.Config) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "coordinator_test_total", Help: "test"}))
	a := server.NewAdmin(server.AdminHandler(reg, holder, reloader), tc, logr.Discard())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.Serve(l) }()
	t.Cleanup(func() { _ = a.Close() })
	if tc != nil {
		return "https://" + l.Addr().String()
	}
	return "http://" + l.Addr().String()
}

func TestAdminHandler(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.Address = "http://gateway.test:80"
	cfg.Pipeline.Steps = []config.Step{{Type: "decode"}}
	p, err := builder.Build(cfg, builder.Options{Revision: "rev-1"})
	if err != nil {
		t.Fatal(err)
	}
	holder := &pipeline.Holder{}
	holder.Swap(p)
	url := startAdmin(t, holder, fixedStatus{Watching: true, LastError: "bad", LastErrorKey: "pipeline.steps", RejectedRevision: "rev-2"}, nil)
	tests := map[string]struct {
		method, path string
		status       int
		contains     string
	}{
		"metrics":        {method: "GET", path: "/metrics", status: 200, contains: "coordinator_test_total 0"},
		"pipeline":       {method: "GET", path: "/debug/pipeline", status: 200, contains: `"revision":"rev-1"`},
		"rejection":      {method: "GET", path: "/debug/pipeline", status: 200, contains: `"last_error":"bad","last_error_key":"pipeline.steps","rejected_revision":"rev-2"`},
		"HEAD":           {method: "HEAD", path: "/metrics", status: 200},
		"POST":           {method: "POST", path: "/debug/pipeline", status: 405},
		"the API is not": {method: "POST", path: "/v1/chat/completions", status: 404},
		"unknown path":   {method: "GET", path: "/debug/pprof/", status: 404},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp, b := do(t, tc.method, url+tc.path, "", nil)
			if resp.StatusCode != tc.status || !strings.Contains(string(b), tc.contains) {
				t.Fatalf("HTTP %d: %.300s", resp.StatusCode, b)
			}
			if tc.status >= 400 {
				decodeError(t, resp, b)
			}
			if tc.status == 405 && resp.Header.Get("Allow") != "GET, HEAD" {
				t.Fatalf("Allow %q", resp.Header.Get("Allow"))
			}
		})
	}
	_, b := do(t, "GET", url+"/debug/pipeline", "", nil)
	var st server.PipelineStatus
	if err := json.Unmarshal(b, &st); err != nil || st.Gateway != "http://gateway.test:80" || len(st.Steps) != 1 ||
		st.Reload == nil || !st.Reload.Watching || st.Reload.LastErrorKey != "pipeline.steps" {
		t.Fatalf("status %+v (%v)", st, err)
	}

	empty := startAdmin(t, &pipeline.Holder{}, nil, nil)
	resp, b := do(t, "GET", empty+"/debug/pipeline", "", nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("no pipeline: HTTP %d %s", resp.StatusCode, b)
	}
	decodeError(t, resp, b)
}

func TestAdminOverTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "metrics-tls")
	writeCertDir(t, dir, "admin")
	tc, err := conn.TLSConfig(config.Default().Server, dir, "server.metrics_cert_dir", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	url := startAdmin(t, &pipeline.Holder{}, nil, tc)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a test certificate
	resp, err := hc.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil || resp.TLS.PeerCertificates[0].Subject.CommonName != "admin" {
		t.Fatalf("HTTP %d over %v", resp.StatusCode, resp.TLS)
	}
}
