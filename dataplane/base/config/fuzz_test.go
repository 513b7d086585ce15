package config

import (
	"bytes"
	"testing"
	"time"
)

// Fuzz targets of the configuration parser; their seed corpora are in testdata/fuzz/<target>/
// and run with every go test (make fuzz explores further).

// FuzzParse: any document, with or without one environment override, is an error or a
// configuration that survives Marshal and Parse with the same Revision; nothing panics, not even
// the revision of a file that does not parse.
func FuzzParse(f *testing.F) {
	keys := EnvKeys()
	f.Add([]byte(minimal), uint8(0), "")
	f.Add([]byte(minimal), uint8(1), "127.0.0.1:1")
	f.Add([]byte(`
log_level: 4
server: {listen_addr: "127.0.0.1:9000", read_timeout: 5s, write_timeout: 0, max_request_body_size: 2}
gateway: {address: "https://gw.example:8443/base/", timeout: 2m30s}
tracing: {enabled: true, sample_ratio: 0.5, endpoint: "http://otel:4318"}
pipeline:
  kv_connector: kv-nixl
  use_openai_format: false
  steps:
    - type: render
      params: {address: "http://render:8000", max_total_tokens: 8192.0, nested: {a: [1, 2.5, "x", null]}}
    - {type: decode}
`), uint8(3), "10s")
	f.Add([]byte("pipeline:\n  steps: [{type: decode, params: {1: x}}]\n"), uint8(0), "")
	f.Add([]byte("tracing: {sample_ratio: .nan}\npipeline: {steps: [{type: decode}]}\n"), uint8(0), "")
	f.Add([]byte("server: {read_timeout: 30}\n"), uint8(0), "")
	f.Add([]byte("a: &a [*a]\n"), uint8(0), "")
	f.Add([]byte("server: [\n"), uint8(0), "")
	f.Add([]byte(""), uint8(len(keys)-1), "[{type: decode}]")
	f.Fuzz(func(t *testing.T, data []byte, envKey uint8, envValue string) {
		var lookupEnv func(string) (string, bool)
		if envValue != "" {
			name := EnvName(keys[int(envKey)%len(keys)])
			lookupEnv = func(k string) (string, bool) { return envValue, k == name }
		}
		fileRev := FileRevision(data)
		cfg, err := Parse(data, lookupEnv)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an empty error")
			}
			return
		}
		if r := cfg.Tracing.SampleRatio; !(r >= 0 && r <= 1) || cfg.LogLevel < 0 || cfg.LogLevel > 5 || len(cfg.Pipeline.Steps) == 0 {
			t.Fatalf("Parse(%q) accepted %+v", data, cfg)
		}
		for _, d := range []Duration{cfg.Server.ReadTimeout, cfg.Server.WriteTimeout, cfg.Server.ShutdownTimeout, cfg.Gateway.IdleConnTimeout, cfg.Gateway.Timeout} {
			if d < 0 {
				t.Fatalf("Parse(%q) accepted a negative duration: %+v", data, cfg)
			}
		}
		rev := cfg.Revision()
		if lookupEnv == nil && rev != fileRev {
			t.Fatalf("FileRevision %s, Revision %s of %q", fileRev, rev, data)
		}
		out, err := Marshal(cfg)
		if err != nil {
			t.Fatalf("Marshal of a parsed config: %v", err)
		}
		back, err := Parse(out, nil)
		if err != nil {
			t.Fatalf("Parse(Marshal(Parse(%q))): %v\n%s", data, err, out)
		}
		if back.Revision() != rev {
			t.Fatalf("the revision changed across Marshal and Parse:\n%q\n%s", data, out)
		}
		if again, err := Marshal(back); err != nil || !bytes.Equal(again, out) {
			t.Fatalf("Marshal is not stable: %v\n%s\n%s", err, out, again)
		}
	})
}

// FuzzDuration: a Duration is what time.ParseDuration reads and survives its text form.
func FuzzDuration(f *testing.F) {
	for _, s := range []string{"30s", "1m30s", "0", "30", "-1h", "1.5h", "9223372036854775807ns", "9223372036854775808ns", "1e3s", "", "\"", "1µs", "5 s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		std, stdErr := time.ParseDuration(s)
		if (err == nil) != (stdErr == nil) || err == nil && d.Std() != std {
			t.Fatalf("ParseDuration(%q) = %v, %v; time.ParseDuration %v, %v", s, d, err, std, stdErr)
		}
		var u Duration
		if uerr := u.UnmarshalText([]byte(s)); (uerr == nil) != (err == nil) || u != d {
			t.Fatalf("UnmarshalText(%q) = %v, %v", s, u, uerr)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an empty error")
			}
			return
		}
		text, _ := d.MarshalText()
		var back Duration
		if err := back.UnmarshalText(text); err != nil || back != d || d.String() != string(text) {
			t.Fatalf("%q -> %v -> %q -> %v, %v", s, d, text, back, err)
		}
	})
}
