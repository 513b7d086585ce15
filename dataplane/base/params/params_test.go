package params

import (
	"strings"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/config"
)

func TestParams(t *testing.T) {
	tests := map[string]struct {
		own     map[string]any
		read    func(p *Params) any
		want    any
		wantErr string
	}{
		"string default":      {read: func(p *Params) any { return p.String("s", "d") }, want: "d"},
		"string":              {own: map[string]any{"s": "x"}, read: func(p *Params) any { return p.String("s", "d") }, want: "x"},
		"string wrong type":   {own: map[string]any{"s": 1}, read: func(p *Params) any { return p.String("s", "d") }, wantErr: "p.s: must be a string"},
		"inherited":           {read: func(p *Params) any { return p.String("kv_connector", "") }, want: "kv-nixl"},
		"own beats inherited": {own: map[string]any{"kv_connector": "kv-sglang"}, read: func(p *Params) any { return p.String("kv_connector", "") }, want: "kv-sglang"},
		"bool":                {own: map[string]any{"b": true}, read: func(p *Params) any { return p.Bool("b", false) }, want: true},
		"bool wrong":          {own: map[string]any{"b": "yes"}, read: func(p *Params) any { return p.Bool("b", false) }, wantErr: "must be a boolean"},
		"int":                 {own: map[string]any{"n": 8}, read: func(p *Params) any { return p.Int("n", 1, 1) }, want: 8},
		"int64":               {own: map[string]any{"n": int64(8)}, read: func(p *Params) any { return p.Int("n", 1, 1) }, want: 8},
		"integral float":      {own: map[string]any{"n": 8192.0}, read: func(p *Params) any { return p.Int("n", 1, 1) }, want: 8192},
		"fractional float":    {own: map[string]any{"n": 1.5}, read: func(p *Params) any { return p.Int("n", 1, 1) }, wantErr: "must be an integer"},
		"int too small":       {own: map[string]any{"n": 0}, read: func(p *Params) any { return p.Int("n", 1, 1) }, wantErr: "at least 1, got 0"},
		"int wrong":           {own: map[string]any{"n": "8"}, read: func(p *Params) any { return p.Int("n", 1, 1) }, wantErr: "must be an integer"},
		"duration":            {own: map[string]any{"d": "1m30s"}, read: func(p *Params) any { return p.Duration("d", time.Second) }, want: 90 * time.Second},
		"duration no unit":    {own: map[string]any{"d": "30"}, read: func(p *Params) any { return p.Duration("d", time.Second) }, wantErr: "with a unit"},
		"duration number":     {own: map[string]any{"d": 30}, read: func(p *Params) any { return p.Duration("d", time.Second) }, wantErr: "duration string"},
		"duration zero":       {own: map[string]any{"d": "0s"}, read: func(p *Params) any { return p.Duration("d", time.Second) }, wantErr: "must be positive"},
		"string list":         {own: map[string]any{"l": []any{"a", "b"}}, read: func(p *Params) any { return strings.Join(p.StringList("l"), ",") }, want: "a,b"},
		"string list wrong":   {own: map[string]any{"l": []any{"a", 1}}, read: func(p *Params) any { return p.StringList("l") == nil }, wantErr: "item 1 must be a string"},
		"not a list":          {own: map[string]any{"l": "a"}, read: func(p *Params) any { return p.StringList("l") == nil }, wantErr: "must be a list of strings"},
		"null is default":     {own: map[string]any{"n": nil}, read: func(p *Params) any { return p.Int("n", 3, 1) }, want: 3},
		"unknown key":         {own: map[string]any{"n": 1, "typo": 2}, read: func(p *Params) any { return p.Int("n", 3, 1) }, wantErr: "p.typo: unknown parameter (this step accepts: n)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := New("p", tc.own, map[string]any{"kv_connector": "kv-nixl"})
			got := tc.read(p)
			err := p.Err()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if config.KeyOf(err) == "" {
					t.Fatalf("error names no key: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}

func TestParamsEffective(t *testing.T) {
	p := New("p", map[string]any{"n": 2}, nil)
	p.Int("n", 1, 0)
	p.Duration("d", 5*time.Second)
	eff := p.Effective()
	if eff["n"] != 2 || eff["d"] != "5s" {
		t.Fatalf("effective = %v", eff)
	}
}
