package registry

import (
	"context"
	"slices"
	"testing"

	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

type nop struct{}

func (nop) Name() string                                    { return "nop" }
func (nop) Execute(context.Context, *request.Context) error { return nil }

// deps stands for what a registry's factories receive.
type deps struct{}

func newNop(deps, *params.Params) (pipeline.Step, error) { return nop{}, nil }

func TestRegistry(t *testing.T) {
	r := New[deps]()
	r.Register(Type[deps]{Name: "b", New: newNop, Provides: []Capability{Tokens}})
	r.Register(Type[deps]{Name: "a", New: newNop})
	r.Register(Type[deps]{Name: "c", New: newNop, Provides: []Capability{Tokens}})
	if got := r.Names(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("Names = %v", got)
	}
	if got := r.Providers(Tokens); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("Providers = %v", got)
	}
	if typ, ok := r.Lookup("b"); !ok || typ.Name != "b" {
		t.Fatalf("Lookup(b) = %+v, %v", typ, ok)
	}
	if _, ok := r.Lookup("zz"); ok {
		t.Fatal("Lookup(zz) found a type")
	}
}

func TestRegisterRejectsProgrammingErrors(t *testing.T) {
	tests := map[string]Type[deps]{
		"duplicate":  {Name: "a", New: newNop},
		"no name":    {New: newNop},
		"no factory": {Name: "x"},
	}
	for name, typ := range tests {
		t.Run(name, func(t *testing.T) {
			r := New[deps]()
			r.Register(Type[deps]{Name: "a", New: newNop})
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			r.Register(typ)
		})
	}
}
