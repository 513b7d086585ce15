package reload_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.uber.org/goleak"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/reload"
	"github.com/epd-dev/coordinator/dataplane/render"
	_ "github.com/epd-dev/coordinator/dataplane/steps"
	"github.com/epd-dev/coordinator/test/harness/atomicdir"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	decodeOnly  = "gateway: {address: http://gw:80}\npipeline: {steps: [{type: decode}]}\n"
	prefillNIXL = "gateway: {address: http://gw:80}\npipeline: {kv_connector: kv-nixl, steps: [{type: prefill}, {type: decode}]}\n"
)

type fixture struct {
	t      *testing.T
	dir    string
	path   string
	holder *pipeline.Holder
	w      *reload.Watcher
	level  *logging.Level
	mu     sync.Mutex
	events []bool
}

// start serves decodeOnly from path, written by write (kubelet-style or plain), and watches it.
func start(t *testing.T, kubelet bool) *fixture {
	t.Helper()
	f := &fixture{t: t, dir: t.TempDir(), holder: &pipeline.Holder{}}
	f.path = filepath.Join(f.dir, "coordinator.yaml")
	f.write(decodeOnly, kubelet)
	data, _ := os.ReadFile(f.path)
	cfg, err := config.Parse(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	build := func(c config.Config, rev string) (*pipeline.Pipeline, error) {
		return builder.Build(c, builder.Options{Revision: rev})
	}
	p, err := build(cfg, config.FileRevision(data))
	if err != nil {
		t.Fatal(err)
	}
	f.holder.Swap(p)
	_, f.level = logging.NewLeveled(cfg.LogLevel, nil)
	f.w = reload.New(reload.Options{
		Path: f.path, Holder: f.holder, Startup: cfg, Loaded: data, Build: build, Log: logr.Discard(), Level: f.level,
		LookupEnv: func(string) (string, bool) { return "", false }, Debounce: 20 * time.Millisecond, Poll: -1,
		OnReload: func(ok bool, _ *pipeline.Pipeline) { f.mu.Lock(); f.events = append(f.events, ok); f.mu.Unlock() },
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = f.w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.holder.Load().Close() })
	f.waitFor("the watch", func() bool { return f.w.Status().Watching })
	return f
}

func (f *fixture) write(doc string, kubelet bool) {
	f.t.Helper()
	if kubelet {
		if err := atomicdir.Write(f.dir, map[string][]byte{"coordinator.yaml": []byte(doc)}); err != nil {
			f.t.Fatal(err)
		}
		return
	}
	if err := os.WriteFile(f.path, []byte(doc), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// waitFor polls until cond holds.
func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s (status %+v)", what, f.w.Status())
		}
	}
}

func steps(p *pipeline.Pipeline) string {
	var s []string
	for _, st := range p.Steps() {
		s = append(s, st.Type)
	}
	return strings.Join(s, ",")
}

func TestReloadOnEveryKindOfUpdate(t *testing.T) {
	tests := map[string]func(f *fixture, doc string){
		"kubelet ..data swap": func(f *fixture, doc string) { f.write(doc, true) },
		"in-place write":      func(f *fixture, doc string) { f.write(doc, false) },
		"replace by rename": func(f *fixture, doc string) {
			tmp := filepath.Join(f.dir, ".coordinator.yaml.tmp")
			if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, f.path); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, update := range tests {
		t.Run(name, func(t *testing.T) {
			f := start(t, name == "kubelet ..data swap")
			first := f.holder.Load()
			update(f, prefillNIXL)
			f.waitFor("the new pipeline", func() bool { return steps(f.holder.Load()) == "prefill,decode" })
			if f.holder.Load().Revision() == first.Revision() || f.w.Status().Succeeded != 1 {
				t.Fatalf("status %+v", f.w.Status())
			}
			// Back again, and a burst of writes coalesces into few reloads.
			for i := 0; i < 5; i++ {
				update(f, decodeOnly)
			}
			f.waitFor("the old pipeline", func() bool { return steps(f.holder.Load()) == "decode" })
			// A third content marks the end of the burst: events are handled in order, so once it
			// is served every reload the burst caused has happened.
			update(f, prefillNIXL)
			f.waitFor("the marker", func() bool { return steps(f.holder.Load()) == "prefill,decode" })
			if n := f.w.Status().Succeeded; n != 3 {
				t.Fatalf("%d reloads for 1+1+1 distinct contents", n)
			}
		})
	}
}

func TestInvalidConfigKeepsServing(t *testing.T) {
	tests := map[string]struct {
		doc string
		key string
	}{
		"bad YAML":                 {doc: "pipeline: [\n", key: ""},
		"unknown step":             {doc: "gateway: {address: http://gw}\npipeline: {steps: [{type: prefil}, {type: decode}]}", key: "pipeline.steps[0].type"},
		"bad param":                {doc: "gateway: {address: http://gw}\npipeline: {steps: [{type: render, params: {address: http://r, max_total_tokens: -1}}, {type: decode}]}", key: "pipeline.steps[0].params.max_total_tokens"},
		"tokens-in without render": {doc: "gateway: {address: http://gw}\npipeline: {use_openai_format: false, steps: [{type: decode}]}", key: "pipeline.use_openai_format"},
		"empty file":               {doc: "", key: "pipeline.steps"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f := start(t, true)
			good := f.holder.Load()
			f.write(tc.doc, true)
			f.waitFor("the rejection", func() bool { return f.w.Status().Failed == 1 })
			st := f.w.Status()
			if f.holder.Load() != good || st.LastError == "" || st.LastErrorKey != tc.key {
				t.Fatalf("status %+v", st)
			}
			// The rejected revision is the one the operator computes for the content.
			if want := config.FileRevision([]byte(tc.doc)); st.RejectedRevision != want || want == good.Revision() {
				t.Fatalf("rejected_revision %q, want %q (serving %s)", st.RejectedRevision, want, good.Revision())
			}
			// The rejected content is not retried; the next good one clears the error.
			if err := f.w.Reload(); err != nil || f.w.Status().Failed != 1 {
				t.Fatalf("rejected content rebuilt: %v", err)
			}
			f.write(prefillNIXL, true)
			f.waitFor("recovery", func() bool { return f.w.Status().Succeeded == 1 })
			if st := f.w.Status(); st.LastError != "" || st.RejectedRevision != "" || steps(f.holder.Load()) != "prefill,decode" {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

func TestRestartRequiredAndLiveSettings(t *testing.T) {
	f := start(t, true)
	f.write("log_level: 5\nserver: {listen_addr: ':9999', read_timeout: 5s, max_request_body_size: 2, shutdown_timeout: 3s}\n"+decodeOnly, true)
	f.waitFor("reload", func() bool { return f.w.Status().Succeeded == 1 })
	st := f.w.Status()
	if strings.Join(st.RestartRequired, ",") != "server.listen_addr,server.read_timeout" {
		t.Fatalf("restart required %v", st.RestartRequired)
	}
	cfg := f.holder.Load().Config()
	if cfg.Server.MaxRequestBodyBytes() != 2<<20 || cfg.Server.ShutdownTimeout.Std() != 3*time.Second || f.level.Get() != 5 {
		t.Fatalf("live settings not applied: %+v level %d", cfg.Server, f.level.Get())
	}
}

func TestMissingFileMidSwapIsIgnored(t *testing.T) {
	f := start(t, false)
	good := f.holder.Load()
	if err := os.Remove(f.path); err != nil {
		t.Fatal(err)
	}
	if err := f.w.Reload(); err != nil || f.holder.Load() != good || f.w.Status().Failed != 0 {
		t.Fatalf("a missing file changed the pipeline: %v %+v", err, f.w.Status())
	}
	// The file reappears with new content: the watcher handled the removal's event first (events
	// run in order), so had it failed, Failed would count it by the time the new pipeline serves.
	f.write(prefillNIXL, false)
	f.waitFor("the new file", func() bool { return steps(f.holder.Load()) == "prefill,decode" })
	if st := f.w.Status(); st.Failed != 0 || st.Succeeded != 1 {
		t.Fatalf("status %+v", st)
	}
}

// TestWaitingConfigIsRetried: a configuration that waits for files it refers to (a render step's
// tokenizer_revision ahead of the mounted files, as when the kubelet refreshes the configuration's
// volume before the tokenizer's) is rejected, keeps the last pipeline serving, and is built again
// by the next reload, without the file changing, once the files caught up.
func TestWaitingConfigIsRetried(t *testing.T) {
	f := start(t, true)
	good := f.holder.Load()
	tokDir := filepath.Join(t.TempDir(), "tokenizer")
	fixture := "../render/testdata/chatml"
	files := map[string][]byte{}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(fixture, name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	next := map[string][]byte{"tokenizer.json": files["tokenizer.json"], "tokenizer_config.json": append([]byte(nil), files["tokenizer_config.json"]...)}
	next["tokenizer_config.json"] = append(next["tokenizer_config.json"][:len(next["tokenizer_config.json"])-1], []byte(`, "pad_token": "<|endoftext|>"}`)...)
	if err := atomicdir.Write(tokDir, files); err != nil { // the files as they were
		t.Fatal(err)
	}
	doc := fmt.Sprintf("gateway: {address: http://gw:80}\npipeline: {steps: [{type: render, params: {tokenizer: %q, tokenizer_revision: %q}}, {type: decode}]}\n",
		tokDir, render.Revision(next))
	f.write(doc, true)
	f.waitFor("the rejection", func() bool { return f.w.Status().Failed == 1 })
	if st := f.w.Status(); f.holder.Load() != good || st.LastErrorKey != "pipeline.steps[0].params.tokenizer_revision" || !strings.Contains(st.LastError, "waiting for them") {
		t.Fatalf("status %+v", st)
	}
	if err := atomicdir.Write(tokDir, next); err != nil { // the kubelet refreshes the tokenizer's volume
		t.Fatal(err)
	}
	if err := f.w.Reload(); err != nil { // a poll: the configuration file itself did not change
		t.Fatalf("the waiting configuration was not retried: %v", err)
	}
	if st := f.w.Status(); st.Succeeded != 1 || st.LastError != "" || steps(f.holder.Load()) != "render,decode" {
		t.Fatalf("status %+v", st)
	}
}
