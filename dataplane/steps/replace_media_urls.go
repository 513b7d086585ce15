package steps

import (
	"context"

	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// ReplaceMediaURLsStep is the type name of the media inlining step.
const ReplaceMediaURLsStep = "replace-media-urls"

func init() {
	builder.Register(builder.Type{Name: ReplaceMediaURLsStep, New: newReplaceMediaURLs, Provides: []registry.Capability{registry.Media}})
}

// replaceMediaURLs guards the media of conversational requests: every media part is checked,
// remote media downloaded behind the SSRF guard and inlined as data: URLs, within the byte
// budgets of its params and the process's (media.Inliner).
type replaceMediaURLs struct {
	inliner *media.Inliner
}

func newReplaceMediaURLs(deps builder.Deps, p *params.Params) (pipeline.Step, error) {
	return &replaceMediaURLs{inliner: media.New(p, media.Options{Budget: deps.Shared.Media, AllowAddr: deps.Overrides.MediaAllowAddr,
		Metrics: deps.Telemetry.Metrics})}, nil
}

func (*replaceMediaURLs) Name() string { return ReplaceMediaURLsStep }

var _ pipeline.Closer = (*replaceMediaURLs)(nil)

// Close drops pooled connections to media hosts.
func (s *replaceMediaURLs) Close() { s.inliner.Close() }

func (s *replaceMediaURLs) Execute(ctx context.Context, rc *request.Context) error {
	l := wire.Of(rc.API).Media()
	if l == nil {
		return nil // the format carries no media
	}
	return s.inliner.Replace(ctx, rc, *l)
}
