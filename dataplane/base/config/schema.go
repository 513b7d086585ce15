package config

import "fmt"

// SchemaVersion is the version of the configuration schema this build reads: its keys (every
// field of Config, at any depth), the step types and each step's params. The coordinator rejects
// unknown keys, so a coordinator image can only run a configuration rendered for its schema or an
// older one.
//
// The rule: a change that adds a key, a step type, a step param or an accepted value the previous
// release's coordinator would reject bumps SchemaVersion by one (and keeps every older key working:
// keys are never removed or renamed while the API is served). Changes that do not alter what is
// accepted (defaults, behaviour, messages) leave it alone.
//
// The coordinator image carries it as the OCI label SchemaLabel (Dockerfile.coordinator; a test
// keeps them equal), `coordinator --version` prints it, and the operator, built from the same
// tree, refuses to render for a coordinator image that declares an older schema
// (docs/upgrades.md).
//
// Schema 1 is the first versioned one; schema 2 added canary and server.metrics_tenant_header;
// schema 3 the modalities param of replace-media-urls (per-modality limits for audio and video);
// schema 4 gateway.allowed_hint_networks (loopback and link-local networks the endpoint picker's
// hints and reservations may name) and the cost limits server.max_content_blocks,
// gateway.max_event_size, gateway.retry.max_resume_size and gateway.retry.max_resume_memory;
// schema 5 server.drain_delay; schema 6 rate_limit (per-tenant request and token limits, and
// the tenants' objectives).
const SchemaVersion = 6

// NeededSchema is the oldest schema that reads c, and the key that needs it ("" for schema 1):
// the operator renders only what the coordinator image reads, and refuses an image of an older
// schema only when the configuration uses a key that image cannot read. A key added with a
// schema bump is added here too (a test walks the schema's keys).
func (c Config) NeededSchema() (version int, key string) {
	if c.RateLimit != nil {
		return 6, "rate_limit"
	}
	if c.Server.DrainDelay != nil {
		return 5, "server.drain_delay"
	}
	if len(c.Gateway.AllowedHintNetworks) > 0 {
		return 4, "gateway.allowed_hint_networks"
	}
	if key := costLimits(c); key != "" {
		return 4, key
	}
	if key := mediaModalities(c.Pipeline, "pipeline"); key != "" {
		return 3, key
	}
	if c.Canary != nil {
		if key := mediaModalities(c.Canary.Pipeline, "canary.pipeline"); key != "" {
			return 3, key
		}
	}
	switch {
	case c.Canary != nil:
		return 2, "canary"
	case c.Server.MetricsTenantHeader != "":
		return 2, "server.metrics_tenant_header"
	}
	return 1, ""
}

// costLimits returns the first schema-4 limit c sets, "" when none is set (0, the default, is
// not rendered).
func costLimits(c Config) string {
	for _, k := range []struct {
		key string
		set bool
	}{
		{"server.max_content_blocks", c.Server.MaxContentBlocks != 0},
		{"gateway.max_event_size", c.Gateway.MaxEventSize != 0},
		{"gateway.retry.max_resume_size", c.Gateway.Retry.MaxResumeSize != 0},
		{"gateway.retry.max_resume_memory", c.Gateway.Retry.MaxResumeMemory != 0},
	} {
		if k.set {
			return k.key
		}
	}
	return ""
}

// mediaModalities returns the key of the first replace-media-urls step of p (at key) that sets
// the modalities param (schema 3), "" when none does.
func mediaModalities(p Pipeline, key string) string {
	for i, s := range p.Steps {
		if _, ok := s.Params["modalities"]; ok && s.Type == "replace-media-urls" {
			return fmt.Sprintf("%s.steps[%d].params.modalities", key, i)
		}
	}
	return ""
}

// SchemaLabel is the coordinator image's OCI label holding SchemaVersion; the operator reads the
// same name as an annotation of a CoordinatorPipeline that sets spec.image.
const SchemaLabel = "coordinator.epd.dev/config-schema"
