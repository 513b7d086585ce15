package config

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// The coordinator image declares the schema this tree reads.
func TestImageLabelIsTheSchemaVersion(t *testing.T) {
	data, err := os.ReadFile("../../../Dockerfile.coordinator")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`%s="%d"`, SchemaLabel, SchemaVersion)
	if !strings.Contains(string(data), want) {
		t.Fatalf("Dockerfile.coordinator has no LABEL %s: bump the label with SchemaVersion", want)
	}
}

// Every key is readable by schema 1 but those NeededSchema names: a key added with a schema bump
// must be added there (and here).
func TestNeededSchema(t *testing.T) {
	since := map[string]int{"canary": 2, "server.metrics_tenant_header": 2, "gateway.allowed_hint_networks": 4, "server.max_content_blocks": 4,
		"gateway.max_event_size": 4, "gateway.retry.max_resume_size": 4, "gateway.retry.max_resume_memory": 4, "server.drain_delay": 5, "rate_limit": 6}
	if len(EnvKeys()) != 50 {
		t.Fatalf("%d keys: a new key needs a decision here (and in NeededSchema when it bumps the schema)", len(EnvKeys()))
	}
	cfg, err := Parse([]byte(minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	if v, key := cfg.NeededSchema(); v != 1 || key != "" {
		t.Fatalf("a plain configuration needs schema %d (%s), want 1", v, key)
	}
	cfg.Server.MetricsTenantHeader = "x-tenant"
	if v, key := cfg.NeededSchema(); v != since["server.metrics_tenant_header"] || key != "server.metrics_tenant_header" {
		t.Fatalf("a tenant header needs schema %d (%s), want 2", v, key)
	}
	cfg.Canary = NewCanary()
	if v, key := cfg.NeededSchema(); v != since["canary"] || key != "canary" {
		t.Fatalf("a canary needs schema %d (%s), want 2 (canary)", v, key)
	}
	// Step params are not keys of Config: replace-media-urls' modalities needs schema 3.
	cfg.Canary.Pipeline.Steps = []Step{{Type: "render"}, {Type: "replace-media-urls", Params: map[string]any{"modalities": map[string]any{}}}}
	if v, key := cfg.NeededSchema(); v != 3 || key != "canary.pipeline.steps[1].params.modalities" {
		t.Fatalf("a canary's modalities need schema %d (%s), want 3", v, key)
	}
	cfg.Pipeline.Steps = []Step{{Type: "replace-media-urls", Params: map[string]any{"modalities": map[string]any{"audio": map[string]any{"max_size": 25}}}}}
	if v, key := cfg.NeededSchema(); v != 3 || key != "pipeline.steps[0].params.modalities" {
		t.Fatalf("modalities need schema %d (%s), want 3", v, key)
	}
	// The allow list of hint networks needs schema 4, whatever else the configuration has.
	cfg.Gateway.AllowedHintNetworks = []string{"127.0.0.0/8"}
	if v, key := cfg.NeededSchema(); v != since["gateway.allowed_hint_networks"] || key != "gateway.allowed_hint_networks" {
		t.Fatalf("an allow list of hint networks needs schema %d (%s), want 4", v, key)
	}
	cfg.Gateway.AllowedHintNetworks = []string{}
	cfg.Pipeline.Steps[0].Params = map[string]any{"max_download_size": 20}
	cfg.Canary = nil
	if v, key := cfg.NeededSchema(); v != 2 || key != "server.metrics_tenant_header" {
		t.Fatalf("a replace-media-urls step without modalities needs schema %d (%s)", v, key)
	}
	// The cost limits of schema 4: absent (0, the default) they are not rendered.
	for key, set := range map[string]func(*Config){
		"server.max_content_blocks":       func(c *Config) { c.Server.MaxContentBlocks = 100 },
		"gateway.max_event_size":          func(c *Config) { c.Gateway.MaxEventSize = 64 },
		"gateway.retry.max_resume_size":   func(c *Config) { c.Gateway.Retry.MaxResumeSize = 64 },
		"gateway.retry.max_resume_memory": func(c *Config) { c.Gateway.Retry.MaxResumeMemory = 8 },
	} {
		c := cfg
		set(&c)
		if v, got := c.NeededSchema(); v != since[key] || got != key {
			t.Errorf("%s needs schema %d (%s), want %d", key, v, got, since[key])
		}
		out, err := Marshal(cfg)
		if err != nil || strings.Contains(string(out), key[strings.LastIndexByte(key, '.')+1:]) {
			t.Errorf("the default of %s is rendered (%v):\n%s", key, err, out)
		}
	}
}

// server.drain_delay is rendered only when set: unset, the coordinator drains for
// DefaultDrainDelay and the configuration reads on a coordinator of schema 4; set, 0 included
// (no delay), it is rendered, reads back the same and needs schema 5.
func TestDrainDelay(t *testing.T) {
	zero, seven := Duration(0), Duration(7*time.Second)
	tests := map[string]struct {
		set      *Duration
		want     time.Duration
		rendered string // the rendered line, "" when the key is not rendered
		needs    int
		needsKey string
	}{
		"unset: the default": {set: nil, want: DefaultDrainDelay, needs: 1},
		"0s: no delay":       {set: &zero, want: 0, rendered: "drain_delay: 0s", needs: 5, needsKey: "server.drain_delay"},
		"7s":                 {set: &seven, want: 7 * time.Second, rendered: "drain_delay: 7s", needs: 5, needsKey: "server.drain_delay"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse([]byte(minimal), nil)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Server.DrainDelay = tc.set
			if got := cfg.Server.Drain(); got != tc.want {
				t.Errorf("Drain() = %s, want %s", got, tc.want)
			}
			if v, key := cfg.NeededSchema(); v != tc.needs || key != tc.needsKey {
				t.Errorf("NeededSchema() = %d (%q), want %d (%q)", v, key, tc.needs, tc.needsKey)
			}
			out, err := Marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(string(out), "drain_delay"); got != (tc.rendered != "") || tc.rendered != "" && !strings.Contains(string(out), tc.rendered) {
				t.Fatalf("rendered (want %q):\n%s", tc.rendered, out)
			}
			back, err := Parse(out, nil)
			if err != nil || back.Server.Drain() != tc.want || back.Revision() != cfg.Revision() {
				t.Fatalf("read back drain %s, revision %s (want %s): %v", back.Server.Drain(), back.Revision(), cfg.Revision(), err)
			}
		})
	}
}

// An empty allow list of hint networks is not rendered: a configuration without it reads on a
// coordinator of schema 3, which would refuse the unknown key.
func TestEmptyHintNetworksAreNotRendered(t *testing.T) {
	cfg, err := Parse([]byte("gateway: {address: http://gw, allowed_hint_networks: []}\npipeline: {steps: [{type: decode}]}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "allowed_hint_networks") {
		t.Fatalf("rendered %s", out)
	}
	cfg.Gateway.AllowedHintNetworks = []string{"127.0.0.0/8", "::1/128"}
	if out, err = Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	back, err := Parse(out, nil)
	if err != nil || !slices.Equal(back.Gateway.AllowedHintNetworks, cfg.Gateway.AllowedHintNetworks) || back.Revision() != cfg.Revision() {
		t.Fatalf("read back %v (%v)", back.Gateway.AllowedHintNetworks, err)
	}
}
