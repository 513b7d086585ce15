package simworker

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"zero value", Config{}, ""},
		{"prefill sglang", Config{Role: RolePrefill, KVConnector: KVSGLang}, ""},
		{"unknown role", Config{Role: "router"}, "unknown role"},
		{"unknown kv", Config{KVConnector: "kv-magic"}, "unknown KV connector"},
		{"unknown ec", Config{ECConnector: "ec-magic"}, "unknown EC connector"},
		{"kv shared without dir", Config{Role: RoleDecode, KVConnector: KVSharedStorage}, "KVDir is required"},
		{"kv shared on encode needs no dir", Config{Role: RoleEncode, KVConnector: KVSharedStorage}, ""},
		{"ec shared without dir", Config{Role: RoleEncode, ECConnector: ECSharedStorage}, "ECDir is required"},
		{"ec shared on decode needs no dir", Config{Role: RoleDecode, ECConnector: ECSharedStorage}, ""},
		{"negative latency", Config{TTFT: -time.Second}, "must not be negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("unexpected error %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	got := Config{Role: RoleDecode}.withDefaults()
	want := Config{
		Name: "simworker-decode", Role: RoleDecode, KVConnector: KVNixl, ECConnector: ECNixl,
		DefaultMaxTokens: 16, CacheSize: 1024, ModelName: "sim-model", BootstrapTimeout: DefaultBootstrapTimeout,
		SideChannelTimeout: DefaultSideChannelTimeout,
	}
	if got != want {
		t.Errorf("withDefaults = %+v, want %+v", got, want)
	}
}
