package broker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/broker"
	_ "github.com/epd-dev/coordinator/dataplane/steps" // the async-broker step

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// Test steps: test-noop does nothing (a step before async-broker), test-sink is terminal.
const (
	noopStep = "test-noop"
	sinkStep = "test-sink"
)

type funcStep struct {
	name     string
	terminal bool
}

func (f funcStep) Name() string                                    { return f.name }
func (f funcStep) Terminal() bool                                  { return f.terminal }
func (f funcStep) Execute(context.Context, *request.Context) error { return nil }

func init() {
	for _, s := range []funcStep{{name: noopStep}, {name: sinkStep, terminal: true}} {
		builder.Register(builder.Type{Name: s.name, New: func(builder.Deps, *params.Params) (pipeline.Step, error) { return s, nil }})
	}
}

// build builds a pipeline of steps (async-broker with params where it appears).
func build(params map[string]any, types ...string) (*pipeline.Pipeline, error) {
	cfg := config.Default()
	for _, typ := range types {
		sc := config.Step{Type: typ}
		if typ == broker.StepType {
			sc.Params = params
		}
		cfg.Pipeline.Steps = append(cfg.Pipeline.Steps, sc)
	}
	return builder.Build(cfg, builder.Options{Getenv: func(string) string { return "" }})
}

func TestParamsRejected(t *testing.T) {
	const url = "redis://127.0.0.1:6379/0"
	with := func(kv ...any) map[string]any {
		m := map[string]any{"redis_url": url}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	objectives := map[string]any{"gold": map[string]any{"reserved": "gold-r", "overflow": "gold-o"}, "default": map[string]any{"reserved": "std"}}
	const p = "pipeline.steps[0].params."
	for _, tc := range []struct {
		name   string
		params map[string]any
		types  []string
		key    string
		reason string
	}{
		{"missing redis_url", map[string]any{}, nil, p + "redis_url", "is required"},
		{"bad redis_url scheme", with("redis_url", "http://redis:6379"), nil, p + "redis_url", "scheme"},
		{"unknown key", with("redis_uri", "x"), nil, p + "redis_uri", "unknown parameter"},
		{"unknown nested quota key", with("quota", map[string]any{"limit": map[string]any{"a": 1}}), nil, p + "quota.limit", "unknown parameter"},
		{"unknown timeouts mode", with("timeouts", map[string]any{"stream": map[string]any{}}), nil, p + "timeouts.stream", "unknown parameter"},
		{"unknown route key", with("routes", []any{map[string]any{"model": "m", "queu": "q"}}), nil, p + "routes[0].queu", "unknown parameter"},
		{"routes not a list", with("routes", map[string]any{"model": "m"}), nil, p + "routes", "must be a list"},
		{"route not a mapping", with("routes", []any{"m"}), nil, p + "routes[0]", "must be a mapping"},
		{"route tier without objective", with("objectives", objectives, "routes", []any{map[string]any{"tier": "silver"}}), nil, p + "routes[0].tier", `tier "silver"`},
		{"default tier without objective", with("objectives", objectives, "default_tier", "bronze"), nil, p + "default_tier", `tier "bronze"`},
		{"route tenant with colon", with("routes", []any{map[string]any{"tenant": "a:b"}}), nil, p + "routes[0].tenant", "':'"},
		{"empty tier objective", with("objectives", map[string]any{"gold": map[string]any{}, "default": map[string]any{"reserved": "x"}}), nil, p + "objectives.gold.reserved", "reserved or an overflow"},
		{"objective unknown key", with("objectives", map[string]any{"default": map[string]any{"reserve": "x"}}), nil, p + "objectives.default.reserve", "unknown parameter"},
		{"forward mode header", with("forward_headers", []any{"x-slo-ttft-ms", "X-AP-Mode"}), nil, p + "forward_headers", "mode_header"},
		{"forward objective header", with("forward_headers", []any{"X-Gateway-Inference-Objective"}), nil, p + "forward_headers", "objective_header"},
		{"forward bad header", with("forward_headers", []any{"bad header"}), nil, p + "forward_headers", "not a valid header name"},
		{"bad mode header", with("mode_header", "X AP"), nil, p + "mode_header", "not a valid header name"},
		{"bad wakeup", with("wakeup_mode", "push"), nil, p + "wakeup_mode", "auto, notify or poll"},
		{"wait default above max", with("timeouts", map[string]any{"wait": map[string]any{"default_seconds": 100, "max_seconds": 10}}), nil, p + "timeouts.wait.default_seconds", "above max_seconds"},
		{"zero default timeout", with("timeouts", map[string]any{"enqueue": map[string]any{"default_seconds": 0}}), nil, p + "timeouts.enqueue.default_seconds", "at least 1"},
		{"negative limit", with("quota", map[string]any{"limits": map[string]any{"teamA": -1}}), nil, p + "quota.limits.teamA", "at least 0"},
		{"limit not a number", with("quota", map[string]any{"limits": map[string]any{"teamA": "ten"}}), nil, p + "quota.limits.teamA", "integer"},
		{"quota not a mapping", with("quota", 5), nil, p + "quota", "must be a mapping"},
		{"bad redis timeout", with("redis_timeout", "2"), nil, p + "redis_timeout", "unit"},
		{"negative wait cap", with("wait_cap_seconds", -1), nil, p + "wait_cap_seconds", "at least 0"},
		{"empty default queue", with("default_queue", " "), nil, p + "default_queue", "must not be empty"},
		{"not first", with(), []string{noopStep, broker.StepType, sinkStep}, "pipeline.steps[1].type", "must be the first step"},
		{"twice", with(), []string{broker.StepType, broker.StepType, sinkStep}, "pipeline.steps[1].type", "must be the first step"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			types := tc.types
			if types == nil {
				types = []string{broker.StepType, sinkStep}
			}
			p, err := build(tc.params, types...)
			if err == nil {
				p.Close()
				t.Fatal("built; want an error")
			}
			if got := config.KeyOf(err); got != tc.key {
				t.Fatalf("error key = %q, want %q (%v)", got, tc.key, err)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %q does not mention %q", err, tc.reason)
			}
		})
	}
}

func TestParamsAccepted(t *testing.T) {
	params := map[string]any{
		"redis_url":          "redis://user:s3cret@127.0.0.1:6379/2",
		"redis_password_env": "REDIS_PASSWORD",
		"redis_timeout":      "500ms",
		"mode_header":        "X-Async",
		"timeouts": map[string]any{
			"enqueue": map[string]any{"default_seconds": 600, "max_seconds": 7200},
			"wait":    map[string]any{"default_seconds": 5000},
		},
		"wait_cap_seconds":    30,
		"fetch_grace_seconds": 0,
		"routes": []any{
			map[string]any{"model": "m1", "tenant": "teamA", "queue": "q-a", "tier": "gold"},
			map[string]any{"model": "*", "queue": "q-any"},
		},
		"objectives":      map[string]any{"gold": map[string]any{"reserved": "gold-r", "overflow": "gold-o"}, "default": map[string]any{"overflow": "batch"}},
		"quota":           map[string]any{"prefix": "q:", "attribute": "team", "limits": map[string]any{"teamA": 2, "*": 1}, "window_seconds": 60, "timeout": "100ms"},
		"forward_headers": []any{"x-slo-ttft-ms", "authorization"},
		"wakeup_mode":     "POLL",
		"serve_models":    true,
	}
	p, err := build(params, broker.StepType, sinkStep)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	eff := p.Steps()[0].Params
	if got := eff["redis_url"]; got != "redis://user:xxxxx@127.0.0.1:6379/2" {
		t.Errorf("effective redis_url = %v: the password must not show in /debug/pipeline", got)
	}
	c := parse(t, params)
	if c.RedisURL != "redis://user:s3cret@127.0.0.1:6379/2" || c.PasswordEnv != "REDIS_PASSWORD" || c.RedisTimeout != 500*time.Millisecond || c.ModeHeader != "X-Async" {
		t.Errorf("redis url/password env/timeout/mode header = %s/%s/%s/%s", c.RedisURL, c.PasswordEnv, c.RedisTimeout, c.ModeHeader)
	}
	if c.Enqueue != (broker.Timeouts{600 * time.Second, 7200 * time.Second}) {
		t.Errorf("enqueue timeouts = %+v", c.Enqueue)
	}
	// The wait clamp defaults to 3600s, raised to the default when that is higher.
	if c.Wait != (broker.Timeouts{5000 * time.Second, 5000 * time.Second}) {
		t.Errorf("wait timeouts = %+v", c.Wait)
	}
	if c.WaitCap != 30*time.Second || c.FetchGrace != 0 || c.Wakeup != broker.WakeupPoll || !c.ServeModels {
		t.Errorf("cap/grace/wakeup/models = %s/%s/%s/%v", c.WaitCap, c.FetchGrace, c.Wakeup, c.ServeModels)
	}
	for _, tc := range []struct{ model, tenant, queue, tier string }{
		{"m1", "teamA", "q-a", "gold"},
		{"m1", "teamB", "q-any", "default"},
		{"m2", "teamA", "q-any", "default"},
	} {
		if r := c.Route(tc.model, tc.tenant); r.Queue != tc.queue || r.Tier != tc.tier {
			t.Errorf("route(%s,%s) = %s/%s, want %s/%s", tc.model, tc.tenant, r.Queue, r.Tier, tc.queue, tc.tier)
		}
	}
	if n, ok := c.Quota.Limit("teamA"); !ok || n != 2 {
		t.Errorf("teamA limit = %d,%v", n, ok)
	}
	if n, ok := c.Quota.Limit("other"); !ok || n != 1 {
		t.Errorf("wildcard limit = %d,%v", n, ok)
	}
	if c.Quota.Key("teamA") != "q:team:teamA" || c.Quota.Window != time.Minute || c.Quota.Timeout != 100*time.Millisecond {
		t.Errorf("quota key/window/timeout = %s/%s/%s", c.Quota.Key("teamA"), c.Quota.Window, c.Quota.Timeout)
	}
	if strings.Join(c.Forward, ",") != "X-Slo-Ttft-Ms,Authorization" {
		t.Errorf("forward headers = %v", c.Forward)
	}
}

func TestParamsDefaults(t *testing.T) {
	c := parse(t, map[string]any{"redis_url": "redis://127.0.0.1:6379"})
	if c.ModeHeader != broker.DefaultModeHeader || c.TenantHeader != broker.DefaultTenantHeader || c.TimeoutHeader != broker.DefaultTimeoutHeader ||
		c.ObjectiveHeader != broker.DefaultObjectiveHeader || c.FairnessHeader != broker.DefaultFairnessHeader {
		t.Errorf("headers = %s %s %s %s %s", c.ModeHeader, c.TenantHeader, c.TimeoutHeader, c.ObjectiveHeader, c.FairnessHeader)
	}
	if c.Enqueue != (broker.Timeouts{time.Hour, 0}) || c.Wait != (broker.Timeouts{time.Minute, time.Hour}) {
		t.Errorf("timeouts = %+v %+v", c.Enqueue, c.Wait)
	}
	if c.WaitCap != 0 || c.FetchGrace != time.Minute || c.Wakeup != broker.WakeupAuto || c.RedisTimeout != 2*time.Second {
		t.Errorf("cap/grace/wakeup/timeout = %s/%s/%s/%s", c.WaitCap, c.FetchGrace, c.Wakeup, c.RedisTimeout)
	}
	if r := c.Route("any", "any"); r.Queue != broker.DefaultQueue || r.Tier != broker.DefaultTier {
		t.Errorf("default route = %+v", r)
	}
	if c.Quota.Key("t") != "quota:userid:t" || c.Quota.Window != 5*time.Minute {
		t.Errorf("quota = %s %s", c.Quota.Key("t"), c.Quota.Window)
	}
	if _, ok := c.Quota.Limit("t"); ok {
		t.Error("a tenant without a limit has one")
	}
	if strings.Join(c.Forward, ",") != "X-Slo-Ttft-Ms,X-Slo-Tpot-Ms" {
		t.Errorf("forward headers = %v", c.Forward)
	}
}

// parse is the settings of the async-broker params own.
func parse(t *testing.T, own map[string]any) *broker.Settings {
	t.Helper()
	p := params.New("params", own, nil)
	c, err := broker.ParseSettings(p)
	if err == nil {
		err = p.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}
