package packaging

import (
	"reflect"
	"testing"
)

func TestShellWords(t *testing.T) {
	tests := map[string][]string{
		`helm install x charts/x --set a=b`:                  {"helm", "install", "x", "charts/x", "--set", "a=b"},
		`--set 'nodeSelector.kubernetes\.io/os=linux'`:       {"--set", `nodeSelector.kubernetes\.io/os=linux`},
		`make bundle IMG="a b"c  # a comment`:                {"make", "bundle", "IMG=a bc"},
		`operator-sdk olm install        # once per cluster`: {"operator-sdk", "olm", "install"},
	}
	for in, want := range tests {
		got, err := shellWords(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("shellWords(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := shellWords(`echo 'unterminated`); err == nil {
		t.Error("want an error for an unterminated quote")
	}
}
