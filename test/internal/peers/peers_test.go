package peers

import (
	"testing"
	"time"
)

func TestStatCPU(t *testing.T) {
	tests := map[string]struct {
		stat    string
		want    time.Duration
		wantErr bool
	}{
		"plain name": {stat: "4242 (llm-d-inference) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 37 0 0 20 0 12 0",
			want: 2870 * time.Millisecond},
		"name with spaces and parentheses": {stat: "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0",
			want: 70 * time.Millisecond},
		"truncated":      {stat: "7 (sim) R 1 7 7 0 -1 0 0 0 0 0 3", wantErr: true},
		"not a number":   {stat: "7 (sim) R 1 7 7 0 -1 0 0 0 0 0 x 4 0", wantErr: true},
		"no name at all": {stat: "", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := statCPU([]byte(tc.stat))
			if (err != nil) != tc.wantErr {
				t.Fatalf("statCPU(%q) error = %v, want an error: %v", tc.stat, err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("statCPU(%q) = %v, want %v", tc.stat, got, tc.want)
			}
		})
	}
}
