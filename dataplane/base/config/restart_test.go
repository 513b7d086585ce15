package config

import (
	"maps"
	"reflect"
	"slices"
	"testing"
)

// Every configuration key has a case: changing it changes exactly the restart setting named in
// wantRestart (the key itself, or the section it belongs to), or none when a reload applies it.
// A key added to the schema needs a decision here.
func TestRestartSettings(t *testing.T) {
	tests := map[string]struct {
		value       string // an override different from the base configuration's value
		wantRestart string // the RestartSettings key that changes; "" when none does
	}{
		"log_level":                             {value: "5"},
		"server.listen_addr":                    {value: ":8181", wantRestart: "server.listen_addr"},
		"server.read_timeout":                   {value: "7s", wantRestart: "server.read_timeout"},
		"server.write_timeout":                  {value: "7s", wantRestart: "server.write_timeout"},
		"server.shutdown_timeout":               {value: "7s"},
		"server.drain_delay":                    {value: "7s"},
		"server.max_request_body_size":          {value: "7"},
		"server.metrics_port":                   {value: "9191", wantRestart: "server.metrics_port"},
		"server.server_timing":                  {value: "true"},
		"server.metrics_host":                   {value: "127.0.0.2", wantRestart: "server.metrics_host"},
		"server.trusted_routing_headers":        {value: "true"},
		"server.secure_serving":                 {value: "true", wantRestart: "server.secure_serving"},
		"server.cert_path":                      {value: "/etc/coordinator-tls", wantRestart: "server.cert_path"},
		"server.tls_min_version":                {value: "VersionTLS13", wantRestart: "server.tls_min_version"},
		"server.tls_cipher_suites":              {value: "[TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]", wantRestart: "server.tls_cipher_suites"},
		"server.metrics_cert_dir":               {value: "/etc/coordinator-tls", wantRestart: "server.metrics_cert_dir"},
		"gateway.ca_file":                       {value: "/etc/coordinator-gateway-ca/ca.crt"},
		"gateway.address":                       {value: "http://other-gateway:80"},
		"gateway.max_idle_conns_per_host":       {value: "7"},
		"gateway.idle_conn_timeout":             {value: "7s"},
		"gateway.timeout":                       {value: "7s"},
		"gateway.idle_timeout":                  {value: "7s"},
		"gateway.request_timeout":               {value: "7s"},
		"gateway.max_response_size":             {value: "7"},
		"gateway.retry.max_attempts":            {value: "7"},
		"gateway.retry.max_retries_per_request": {value: "7"},
		"gateway.retry.initial_backoff":         {value: "7ms"},
		"gateway.retry.max_backoff":             {value: "7s"},
		"gateway.retry.max_retry_after":         {value: "7s"},
		"gateway.retry.budget_ratio":            {value: "0.7"},
		"gateway.retry.budget_min_per_second":   {value: "7"},
		"gateway.profile_headers":               {value: "[x-llm-d-epp-profile]"},
		"gateway.allowed_hint_networks":         {value: "[127.0.0.0/8]"},
		"pipeline.forward_response_headers":     {value: "[]"},
		"pipeline.on_pool_failure":              {value: "fail"},
		"pipeline.kv_connector":                 {value: "kv-nixl"},
		"pipeline.ec_connector":                 {value: "ec-nixl"},
		"pipeline.use_openai_format":            {value: "false"},
		"pipeline.steps":                        {value: "[{type: render, params: {address: 'http://render:8000'}}, {type: decode}]"},
		"tracing.enabled":                       {value: "true", wantRestart: "tracing"},
		"tracing.endpoint":                      {value: "http://otel-collector:4318", wantRestart: "tracing"},
		"tracing.sample_ratio":                  {value: "0.5", wantRestart: "tracing"},
		"tracing.service_name":                  {value: "coordinator-b", wantRestart: "tracing"},
		"server.metrics_tenant_header":          {value: "x-tenant"},
		"server.max_content_blocks":             {value: "7"},
		"gateway.max_event_size":                {value: "7"},
		"gateway.retry.max_resume_size":         {value: "7"},
		"gateway.retry.max_resume_memory":       {value: "7"},
		"canary":                                {value: "{weight_percent: 5, pipeline: {steps: [{type: prefill}, {type: decode}]}}"},
		"rate_limit":                            {value: "{redis_url: 'redis://redis:6379/0', tenant_header: x-tenant, default: {requests_per_second: 5}}"},
	}
	keys := slices.Sorted(maps.Keys(tests))
	if want := slices.Sorted(slices.Values(EnvKeys())); !slices.Equal(keys, want) {
		t.Fatalf("cases %q, want one per configuration key %q", keys, want)
	}

	base, err := Parse([]byte(minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	for key, tc := range tests {
		t.Run(key, func(t *testing.T) {
			next, err := Parse([]byte(minimal), env(map[string]string{EnvName(key): tc.value}))
			if err != nil {
				t.Fatal(err)
			}
			if next.Revision() == base.Revision() {
				t.Fatalf("%s=%s does not change the configuration", key, tc.value)
			}
			var changed []string
			was, now := base.RestartSettings(), next.RestartSettings()
			for i := range now {
				if was[i].Key != now[i].Key {
					t.Fatalf("setting %d is %s, then %s: the list must not depend on the values", i, was[i].Key, now[i].Key)
				}
				if !reflect.DeepEqual(was[i].Value, now[i].Value) {
					changed = append(changed, now[i].Key)
				}
			}
			var want []string
			if tc.wantRestart != "" {
				want = []string{tc.wantRestart}
			}
			if !slices.Equal(changed, want) {
				t.Fatalf("changed restart settings %q, want %q", changed, want)
			}
		})
	}
}
