package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestRedactJSON(t *testing.T) {
	long := strings.Repeat("x", 60)
	tests := map[string]struct{ in, want string }{
		"data url":      {in: `{"url":"data:image/png;base64,` + long + `"}`, want: `{"url":"[base64]"}`},
		"http url":      {in: `{"url":"https://example.com/` + long + `"}`, want: `{"url":"[url]"}`},
		"long text":     {in: `{"t":"` + long + `"}`, want: `{"t":"` + long[:50] + `..."}`},
		"short kept":    {in: `{"t":"hi","n":1,"b":true}`, want: `{"b":true,"n":1,"t":"hi"}`},
		"long array":    {in: `[1,2,3,4,5,6,7,8,9,10,11,12]`, want: `[1,2,3,4,5,6,7,8,9,10,"... +2 more"]`},
		"not json":      {in: strings.Repeat("y", 250), want: strings.Repeat("y", 200) + "..."},
		"nested arrays": {in: `{"m":[{"c":[{"u":"data:` + long + `"}]}]}`, want: `{"m":[{"c":[{"u":"[base64]"}]}]}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := RedactJSON([]byte(tc.in)); got != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
	deep := strings.Repeat("[", 40) + strings.Repeat("]", 40)
	if got := RedactJSON([]byte(deep)); !strings.Contains(got, "[truncated]") {
		t.Fatalf("depth not capped: %s", got)
	}
}

func TestLevels(t *testing.T) {
	var buf bytes.Buffer
	log, lvl := NewLeveled(Info, &buf)
	log.V(Debug).Info("hidden")
	log.V(Info).Info("shown", "request_id", "r1")
	log.V(Warn).Info("warning")
	lvl.Set(Debug)
	log.V(Debug).Info("now shown")
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %s", l)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 || lines[0]["level"] != "info" || lines[0]["request_id"] != "r1" || lines[1]["level"] != "warn" ||
		lines[2]["level"] != "debug" || lvl.Get() != Debug {
		t.Fatalf("lines %v", lines)
	}
}

func TestWithValuesLazily(t *testing.T) {
	var buf bytes.Buffer
	base := New(Info, &buf)
	log := WithValuesLazily(base, "request_id", "r1").WithValues("step", "decode")
	log.V(Debug).Info("hidden")
	log.V(Info).Info("shown", "n", 1)
	log.Error(nil, "failed")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines: %q", lines)
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil || m["request_id"] != "r1" || m["step"] != "decode" {
			t.Fatalf("line %s", l)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = WithValuesLazily(base, "request_id", "r1").V(Debug).Enabled() }); allocs > 2 {
		t.Fatalf("%v allocations for a logger that writes nothing", allocs)
	}
}
