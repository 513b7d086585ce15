package ec

import (
	"errors"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/config"
)

func TestNIXLMerge(t *testing.T) {
	d1 := map[string]any{"peer_host": "10.0.0.1", "peer_port": 5501.0, "size_bytes": 2359296.0, "nixl_agent_metadata_b64": "AAA="}
	d2 := map[string]any{"peer_host": "10.0.0.2", "peer_port": 5501.0, "size_bytes": 10.0, "nixl_agent_metadata_b64": "BBB="}
	tests := map[string]struct {
		answers  []map[string]any
		want     map[string]any
		conflict string
	}{
		"two images":             {answers: []map[string]any{{"h1": d1}, {"h2": d2}}, want: map[string]any{"h1": d1, "h2": d2}},
		"identical duplicate":    {answers: []map[string]any{{"h1": d1}, {"h1": map[string]any{"peer_host": "10.0.0.1", "peer_port": 5501.0, "size_bytes": 2359296.0, "nixl_agent_metadata_b64": "AAA="}}}, want: map[string]any{"h1": d1}},
		"null descriptor":        {answers: []map[string]any{{"h1": nil}, {"h2": d2}}, want: map[string]any{"h2": d2}},
		"empty answer":           {answers: []map[string]any{nil, {}}, want: map[string]any{}},
		"conflicting duplicates": {answers: []map[string]any{{"h1": d1}, {"h1": d2}}, conflict: "h1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, _ := New(NIXL)
			acc := map[string]any{}
			var err error
			for _, a := range tc.answers {
				if err = c.Merge(acc, a); err != nil {
					break
				}
			}
			if tc.conflict != "" {
				var ce *ErrConflict
				if !errors.As(err, &ce) || ce.Hash != tc.conflict {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(acc) != len(tc.want) {
				t.Fatalf("acc = %v", acc)
			}
			for k := range tc.want {
				if acc[k] == nil {
					t.Fatalf("missing %s in %v", k, acc)
				}
			}
		})
	}
}

func TestSharedStorageSendsNothing(t *testing.T) {
	c, err := New(SharedStorage)
	if err != nil {
		t.Fatal(err)
	}
	acc := map[string]any{}
	if err := c.Merge(acc, map[string]any{"h1": map[string]any{"peer_host": "x"}}); err != nil || len(acc) != 0 {
		t.Fatalf("acc = %v, err = %v", acc, err)
	}
}

func TestUnknown(t *testing.T) {
	if _, err := New("ec-mooncake"); err == nil {
		t.Fatal("accepted")
	}
}

// The configuration's default ec_connector is this package's shared-storage protocol.
func TestConfigDefault(t *testing.T) {
	if config.DefaultECConnector != SharedStorage {
		t.Fatalf("config.DefaultECConnector = %q, want %q", config.DefaultECConnector, SharedStorage)
	}
}
