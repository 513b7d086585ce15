package kv

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// same compares JSON texts by meaning (key order aside).
func same(t *testing.T, what string, got json.RawMessage, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s is not JSON: %s", what, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		t.Fatalf("%s = %s\nwant      %s", what, gb, wb)
	}
}

func TestPrefillAndDecodeShapes(t *testing.T) {
	nixlAnswer := `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2,4]],"remote_engine_id":"e1","remote_request_id":"r1","remote_host":"10.0.0.42","remote_port":5600,"tp_size":1,"remote_num_tokens":318}`
	tests := map[string]struct {
		name        string
		prefill     string
		fromPrefill string
		decode      string
	}{
		"shared storage": {
			name:        SharedStorage,
			prefill:     `{"do_remote_decode":true,"do_remote_prefill":false}`,
			fromPrefill: `{"ignored":true}`,
			decode:      `{"do_remote_decode":false,"do_remote_prefill":true}`,
		},
		"nixl": {
			name:        NIXL,
			prefill:     `{"do_remote_decode":true,"do_remote_prefill":false,"remote_block_ids":null,"remote_engine_id":null,"remote_host":null,"remote_port":null}`,
			fromPrefill: nixlAnswer,
			decode:      `{"do_remote_decode":false,"do_remote_prefill":true,"remote_block_ids":[[1,2,4]],"remote_engine_id":"e1","remote_host":"10.0.0.42","remote_num_tokens":318,"remote_port":5600,"remote_request_id":"r1","tp_size":1}`,
		},
		"nixl without answer": {
			name:   NIXL,
			decode: `{"do_remote_decode":false,"do_remote_prefill":true}`,
		},
		"nixl non-object answer": {
			name: NIXL, fromPrefill: `"weird"`,
			decode: `{"do_remote_decode":false,"do_remote_prefill":true}`,
		},
		"sglang": {
			name:        SGLang,
			fromPrefill: `{"bootstrap_host":"10.0.0.7","bootstrap_port":8998,"bootstrap_room":"room"}`,
			decode:      `{"bootstrap_host":"10.0.0.7","bootstrap_port":8998,"bootstrap_room":"room","do_remote_decode":false,"do_remote_prefill":true}`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := New(tc.name, func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			if c.Name() != tc.name {
				t.Fatal(c.Name())
			}
			if tc.prefill != "" {
				same(t, "prefill", c.PrefillParams(), tc.prefill)
			}
			var from json.RawMessage
			if tc.fromPrefill != "" {
				from = json.RawMessage(tc.fromPrefill)
			}
			got, err := c.DecodeParams(from)
			if err != nil {
				t.Fatal(err)
			}
			same(t, "decode", got, tc.decode)
			if tc.fromPrefill != "" && string(from) != tc.fromPrefill {
				t.Fatal("prefill answer mutated")
			}
		})
	}
}

func TestSGLangPrefill(t *testing.T) {
	c, err := New(SGLang, func(k string) string {
		if k != SGLangBootstrapPortEnv {
			t.Fatalf("read %s", k)
		}
		return "9001"
	})
	if err != nil {
		t.Fatal(err)
	}
	var a, b map[string]any
	_ = json.Unmarshal(c.PrefillParams(), &a)
	_ = json.Unmarshal(c.PrefillParams(), &b)
	if a["bootstrap_port"] != 9001.0 || a["do_remote_decode"] != true || a["do_remote_prefill"] != false {
		t.Fatalf("params = %v", a)
	}
	if _, hasHost := a["bootstrap_host"]; hasHost {
		t.Fatal("prefill must not carry bootstrap_host")
	}
	room, ok := a["bootstrap_room"].(string)
	if _, err := uuid.Parse(room); !ok || err != nil || a["bootstrap_room"] == b["bootstrap_room"] {
		t.Fatalf("rooms %v %v must be fresh UUIDs", a["bootstrap_room"], b["bootstrap_room"])
	}
}

func TestBootstrapPort(t *testing.T) {
	for v, want := range map[string]int{"": 8998, "1": 1, "65535": 65535, " 7000 ": 7000} { //nolint:gocritic // " 7000 ": spaces are trimmed
		if got, err := bootstrapPort(v); err != nil || got != want {
			t.Errorf("bootstrapPort(%q) = %d, %v", v, got, err)
		}
	}
	for _, v := range []string{"0", "65536", "abc", "-1", "80.5"} {
		if _, err := bootstrapPort(v); err == nil || !strings.Contains(err.Error(), SGLangBootstrapPortEnv) {
			t.Errorf("bootstrapPort(%q) err = %v", v, err)
		}
	}
}

func TestUnknown(t *testing.T) {
	if _, err := New("kv-mooncake", nil); err == nil || !strings.Contains(err.Error(), "known: kv-nixl, kv-sglang, kv-shared-storage") {
		t.Fatalf("err = %v", err)
	}
}

func TestBootstrap(t *testing.T) {
	c, err := New(SGLang, func(string) string { return "9000" })
	if err != nil {
		t.Fatal(err)
	}
	if port, ok := BootstrapPort(c); port != 9000 || !ok {
		t.Fatalf("BootstrapPort = %d %v", port, ok)
	}
	if _, ok := BootstrapPort(nixl{}); ok {
		t.Fatal("kv-nixl has a bootstrap port")
	}
	o, err := body.Parse([]byte(`{"model":"m","routed_dp_rank":1,"data_parallel_rank":2,"disagg_prefill_dp_rank":3,"kv_transfer_params":{"x":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	Bootstrap{Host: "fd00::7", Port: 9000, Room: 42}.Apply(o)
	if got := string(o.Bytes()); got != `{"model":"m","bootstrap_host":"fd00::7","bootstrap_port":9000,"bootstrap_room":42}` {
		t.Fatalf("body %s", got)
	}
}

// The configuration's default kv_connector is this package's shared-storage protocol.
func TestConfigDefault(t *testing.T) {
	if config.DefaultKVConnector != SharedStorage {
		t.Fatalf("config.DefaultKVConnector = %q, want %q", config.DefaultKVConnector, SharedStorage)
	}
}
