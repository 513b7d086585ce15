package steps

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/budget"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
	"github.com/epd-dev/coordinator/dataplane/pipeline/builder"
	"github.com/epd-dev/coordinator/dataplane/pipeline/registry"
	"github.com/epd-dev/coordinator/dataplane/render"
	"github.com/epd-dev/coordinator/dataplane/render/chattemplate"
	"github.com/epd-dev/coordinator/dataplane/render/tokenizer"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
	"github.com/epd-dev/coordinator/dataplane/transport/gateway"
	"github.com/epd-dev/coordinator/dataplane/transport/retry"
	"github.com/epd-dev/coordinator/dataplane/transport/upstream"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// RenderStep is the type name of the tokenize-once step.
const RenderStep = "render"

// defaultRenderMaxResponseMiB bounds a render answer: it carries each item's preprocessed
// inputs (kwargs_data), larger than the media themselves.
const defaultRenderMaxResponseMiB = 128

// Render service paths (vLLM render endpoints).
const (
	renderChatPath        = "/v1/chat/completions/render"
	renderCompletionsPath = "/v1/completions/render"
)

func init() {
	builder.Register(builder.Type{Name: RenderStep, New: newRender, Provides: []registry.Capability{registry.Tokens}})
}

// render tokenizes the request once, in process or through the render service, and records the
// token ids and, from the service, each media item's hash, placeholder, preprocessor output
// (kwargs_data) and, from a vLLM with vllm-project/vllm#54659, its light metadata (mm_metadata)
// for the later legs. With a tokenizer directory, text requests are rendered in process with the
// model's own tokenizer and chat template; requests with media, or with what the in-process
// renderer does not do, go to the render service when there is one and are refused otherwise.
// Requests that already carry tokens (a token-array prompt, the generate format) are validated
// instead of sent.
type renderStep struct {
	client          *upstream.Client // nil without an address
	model           *render.Model    // nil without a tokenizer, or while the operator validates
	retrier         retry.Retrier
	maxResponse     int64
	maxTokens       int
	maxPlaceholders int
	// limits bound an in-process render (max_input_size, max_template_values, max_word_size,
	// max_total_tokens); keys are their full configuration keys, by render.Limits field.
	limits render.Limits
	keys   map[string]string
	// inFlight is the process's render budget (Shared.Render), maxInFlight this step's bound of
	// it (max_inflight_render_size).
	inFlight    *budget.Bytes
	maxInFlight int64
	// kwargs are the chat_template_kwargs a request may pass to the template (the step's
	// chat_template_kwargs param); others are dropped.
	kwargs map[string]bool
}

// defaultTemplateKwargs are the chat_template_kwargs passed to the template by default: the ones
// the served families' templates read (enable_thinking: Qwen3; thinking: DeepSeek-V3.1 and later;
// reasoning_effort, builtin_tools, model_identity: gpt-oss).
var defaultTemplateKwargs = []string{"enable_thinking", "thinking", "reasoning_effort", "builtin_tools", "model_identity"}

// reservedTemplateKwargs are names a chat_template_kwargs key may not have: the variables the
// renderer sets from the request itself (or, for chat_template and tokenize, vLLM's refusal).
var reservedTemplateKwargs = []string{"messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
	"chat_template", "tokenize", "raise_exception", "strftime_now"}

// renderCostPerByte is what an in-process render may hold at its peak per byte of its input: 4
// (the template's tree and output, the pre-tokenizer's scratch) and, at one token a byte (a
// token covers at least one byte), 24 for the ids, their JSON and the growth of the ids' slice.
// It is reserved of the budget before a render starts; after it, a request holds tokenCost per
// token until it ends.
const (
	renderCostPerByte = 28
	tokenCost         = 15 // the id (8) and its JSON (a comma and up to six digits)
)

// Defaults of the in-process render's bounds (docs/configuration.md gives what each allows).
const (
	defaultRenderMaxInputMiB    = 8
	defaultRenderMaxWordKiB     = 64
	defaultRenderMaxTemplValue  = 100_000
	defaultRenderMaxInFlightMiB = 512
)

// defaultRenderCacheMiB is the default size of the in-process renderer's cache of encoded text.
const defaultRenderCacheMiB = 64

// defaultRenderHistoryMiB is the default size of the in-process renderer's rendered-history
// cache (the rendered text and ids of the conversations rendered lately).
const defaultRenderHistoryMiB = 64

func newRender(deps builder.Deps, p *params.Params) (pipeline.Step, error) {
	addr := p.String("address", "")
	dir := p.String("tokenizer", "")
	templateName := p.String("chat_template", "")
	// A mark of the files' contents: whoever changes them (the operator, from the ConfigMap they
	// come from) changes it too, so that the configuration changes and the coordinator reloads,
	// loading the new files. A fingerprint (sha256:...) is checked against the files.
	revision := p.String("tokenizer_revision", "")
	cacheMiB := p.Int("cache_size", defaultRenderCacheMiB, 0)
	historyMiB := p.Int("history_cache_size", defaultRenderHistoryMiB, 0)
	timeout := p.Duration("timeout", 30*time.Second)
	idle := p.Int("max_idle_conns_per_host", 100, 0)
	idleTimeout := p.Duration("idle_conn_timeout", 90*time.Second)
	s := &renderStep{maxTokens: p.Int("max_total_tokens", 0, 0), maxPlaceholders: p.Int("max_total_placeholder_tokens", 0, 0),
		maxResponse: int64(p.Int("max_response_size", defaultRenderMaxResponseMiB, 1)) * config.MiB,
		retrier:     retry.Retrier{Policy: retry.Policy{MaxAttempts: 1}}}
	s.limits = render.Limits{MaxInputBytes: p.Int("max_input_size", defaultRenderMaxInputMiB, 1) * config.MiB,
		MaxValues: p.Int("max_template_values", defaultRenderMaxTemplValue, 1),
		Encode:    tokenizer.Limits{MaxWordBytes: p.Int("max_word_size", defaultRenderMaxWordKiB, 1) * 1024, MaxTokens: s.maxTokens}}
	allowed := defaultTemplateKwargs
	if p.Has("chat_template_kwargs") {
		allowed = p.StringList("chat_template_kwargs")
	}
	s.kwargs = map[string]bool{}
	for _, k := range allowed {
		if slices.Contains(reservedTemplateKwargs, k) || strings.HasPrefix(k, "__") {
			p.Fail("chat_template_kwargs", "%q cannot be a kwarg: the renderer sets it from the request itself", k)
		}
		s.kwargs[k] = true
	}
	s.inFlight = cmp.Or(deps.Shared.Render, &budget.Bytes{})
	s.maxInFlight = int64(p.Int("max_inflight_render_size", defaultRenderMaxInFlightMiB, 1)) * config.MiB
	if need := int64(s.limits.MaxInputBytes) * renderCostPerByte; s.maxInFlight < need {
		p.Fail("max_inflight_render_size", "must be at least %d × max_input_size (%d MiB), the most one render may hold", renderCostPerByte, need/config.MiB)
	}
	s.keys = map[string]string{"MaxInFlight": p.Key("max_inflight_render_size"), "MaxInputBytes": p.Key("max_input_size"), "MaxValues": p.Key("max_template_values"),
		"MaxWordBytes": p.Key("max_word_size"), "MaxTokens": p.Key("max_total_tokens")}
	if deps.Gateway != nil {
		s.retrier = deps.Gateway.Retrier() // gateway.retry applies to render calls too
	}
	switch {
	case addr == "" && dir == "":
		p.Fail("address", "is required unless tokenizer is set: the base URL of the render service, e.g. http://render:8000")
		return s, nil
	case dir == "" && (templateName != "" || p.Has("cache_size") || p.Has("history_cache_size") || p.Has("tokenizer_revision")):
		p.Fail("tokenizer", "is required by chat_template, cache_size, history_cache_size and tokenizer_revision: the directory of the model's tokenizer.json and tokenizer_config.json")
		return s, nil
	case dir != "" && (!filepath.IsAbs(dir) || filepath.Clean(dir) != dir):
		p.Fail("tokenizer", "must be an absolute, clean directory path, got %q", dir)
		return s, nil
	}
	if addr != "" {
		if err := config.ValidateBaseURL(addr); err != nil {
			p.Fail("address", "%v", err)
			return s, nil
		}
		c, err := upstream.NewClient(addr, upstream.TransportOptions{MaxIdleConnsPerHost: idle, IdleConnTimeout: idleTimeout}, timeout, deps.Telemetry)
		if err != nil {
			p.Fail("address", "%v", err)
			return s, nil
		}
		s.client = c
	}
	if dir != "" {
		local := dir
		if deps.Overrides.LocalFiles != nil {
			var ok bool
			if local, ok = deps.Overrides.LocalFiles(dir); !ok {
				return s, nil // the pods load the files
			}
		}
		// The check is for a pod, whose volume may lag its configuration; a local copy (the
		// operator's) is the very files the revision was computed from.
		if deps.Overrides.LocalFiles == nil && strings.HasPrefix(revision, render.RevisionPrefix) {
			got, err := render.DirRevision(local)
			if err != nil {
				p.Fail("tokenizer", "%v", err)
				return s, nil
			}
			if got != revision {
				// The configuration is newer than the files (the kubelet refreshes each mounted
				// volume on its own): a reload is retried until they match.
				return s, &config.FieldError{Key: p.Key("tokenizer_revision"), Retry: true,
					Reason: fmt.Sprintf("the files in %s are revision %s, not %s: waiting for them to be updated", dir, got, revision)}
			}
		}
		m, err := render.Open(local, render.Options{ChatTemplate: templateName, CacheBytes: int64(cacheMiB) * config.MiB,
			HistoryBytes: int64(historyMiB) * config.MiB})
		if err != nil {
			p.Fail("tokenizer", "%v", err)
			return s, nil
		}
		s.model = m
	}
	return s, nil
}

var _ pipeline.Closer = (*renderStep)(nil)

func (*renderStep) Name() string { return RenderStep }

// Close drops pooled connections to the render service and releases the tokenizer.
func (s *renderStep) Close() {
	if s.client != nil {
		s.client.Close()
	}
	if s.model != nil {
		s.model.Close()
	}
}

// Execute tokenizes the prompt as the request's format gives it (wire.Renderer: tokens in, a
// completions prompt, a conversation).
func (s *renderStep) Execute(ctx context.Context, rc *request.Context) error {
	if err := wire.Of(rc.API).Render(ctx, rc, s); err != nil {
		return err
	}
	rc.Rendered = true
	return nil
}

var _ wire.Renderer = (*renderStep)(nil)

func (s *renderStep) checkTokens(n int) error {
	if s.maxTokens > 0 && n > s.maxTokens {
		return apierror.BadRequest("too_many_tokens", "too many total tokens: got %d, max %d (%s)", n, s.maxTokens, s.keys["MaxTokens"])
	}
	return nil
}

// checkVocab refuses a client's token ids outside the loaded tokenizer's vocabulary (field names
// them); without a tokenizer the worker checks them.
func (s *renderStep) checkVocab(field string, ids []int) error {
	if s.model == nil {
		return nil
	}
	size := s.model.VocabSize()
	for i, id := range ids {
		if id >= size {
			return apierror.InvalidField(field, "%q item %d is token id %d, outside the model's vocabulary of %d tokens", field, i, id, size)
		}
	}
	return nil
}

// checkPlaceholders enforces bounds (inside the prompt) and the placeholder-token limit.
func (s *renderStep) checkPlaceholders(rc *request.Context, fromClient bool) error {
	total := 0
	for i, m := range rc.Media {
		ph := m.Placeholder
		if ph.Offset < 0 || ph.Length < 0 || ph.Offset >= rc.TokenCount() || ph.Length > rc.TokenCount()-ph.Offset {
			msg := fmt.Sprintf("placeholder %d {offset %d, length %d} lies outside the %d prompt tokens", i, ph.Offset, ph.Length, rc.TokenCount())
			if fromClient {
				return apierror.InvalidField("features", "%s", msg)
			}
			return &apierror.UpstreamError{Phase: RenderStep, Status: 200, Err: errors.New(msg)}
		}
		total += ph.Length
	}
	if s.maxPlaceholders > 0 && total > s.maxPlaceholders {
		return apierror.BadRequest("too_many_placeholder_tokens", "too many placeholder tokens: got %d, max %d", total, s.maxPlaceholders)
	}
	return nil
}

// TokensIn validates a tokens-in client body; nothing is sent and the body is not changed.
func (s *renderStep) TokensIn(rc *request.Context) error {
	raw, _ := rc.Body.Get("token_ids")
	ids, err := wire.TokenIDs(raw)
	if err != nil {
		return apierror.InvalidField("token_ids", "\"token_ids\" %v", err)
	}
	if len(ids) == 0 {
		return apierror.InvalidField("token_ids", "\"token_ids\" must not be empty")
	}
	if err := s.checkTokens(len(ids)); err != nil {
		return err
	}
	if err := s.checkVocab("token_ids", ids); err != nil {
		return err
	}
	sp, _, err := rc.Body.Object("sampling_params")
	if err != nil {
		return apierror.InvalidField("sampling_params", "%v", err)
	}
	if sp != nil {
		if _, _, err := sp.Object("extra_args"); err != nil {
			return apierror.InvalidField("sampling_params", "sampling_params.extra_args must be an object")
		}
	}
	rc.SetTokenIDs(ids)
	rc.Media = nil
	if rawF, ok := rc.Body.Get("features"); ok && body.KindOf(rawF) != body.KindNull {
		var f wire.Features
		if err := json.Unmarshal(rawF, &f); err != nil {
			return apierror.InvalidField("features", "\"features\" must be an object of mm_hashes, mm_placeholders, kwargs_data and mm_metadata: %v", err)
		}
		items, err := f.Entries()
		if err != nil {
			return apierror.InvalidField("features", "features.%v", err)
		}
		rc.Media = items
	}
	return s.checkPlaceholders(rc, true)
}

// Prompt tokenizes a completions prompt: a string in process or through the render service;
// token ids are checked and kept.
func (s *renderStep) Prompt(ctx context.Context, rc *request.Context) error {
	raw, _ := rc.Body.Get("prompt")
	switch body.KindOf(raw) {
	case body.KindString:
		var ids []int
		var js json.RawMessage // their JSON, when the render service wrote it as it is sent
		if s.model != nil {
			prompt, _, _ := rc.Body.String("prompt")
			addSpecial, present, err := rc.Body.Bool("add_special_tokens")
			if err != nil {
				return apierror.InvalidField("add_special_tokens", "%v", err)
			}
			if err := s.reserve(rc, len(prompt)); err != nil {
				return err
			}
			ids, err = s.model.Prompt(nil, prompt, addSpecial || !present, s.limitsFor(ctx)) // vLLM's default: true
			s.keep(ctx, len(prompt), len(ids))
			if err != nil {
				return s.renderErr(rc, err)
			}
		} else {
			out, err := s.call(ctx, rc, renderCompletionsPath, rc.Body)
			if err != nil {
				return err
			}
			var items []json.RawMessage
			if body.Valid(out) {
				items, _ = body.Array(out)
			}
			if len(items) != 1 || body.KindOf(items[0]) != body.KindObject {
				return &apierror.UpstreamError{Phase: RenderStep, Status: 200, Body: upstream.Head(out), Err: errors.New("completions render answer must be a one-element array")}
			}
			answer, err := body.ParseNested(items[0])
			if err == nil {
				ids, js, err = answerTokenIDs(answer)
			}
			if err != nil {
				return &apierror.UpstreamError{Phase: RenderStep, Status: 200, Body: upstream.Head(out), Err: err}
			}
		}
		if err := s.checkTokens(len(ids)); err != nil {
			return err
		}
		rc.SetTokenIDsJSON(ids, js)
		rc.Body.Set("prompt", rc.TokenIDsJSON())
		return nil
	case body.KindArray:
		if first := bytes.TrimLeft(raw[1:], " \t\r\n"); len(first) > 0 && (first[0] == '[' || first[0] == '"') {
			return apierror.InvalidField("prompt", "batched prompts (a list of strings or token lists) are not supported; send one prompt per request")
		}
		ids, err := wire.TokenIDs(raw)
		if err != nil {
			return apierror.InvalidField("prompt", "a token prompt %v", err)
		}
		if err := s.checkTokens(len(ids)); err != nil {
			return err
		}
		if err := s.checkVocab("prompt", ids); err != nil {
			return err
		}
		rc.SetTokenIDs(ids)
		return nil
	}
	return apierror.InvalidField("prompt", "\"prompt\" must be a string or an array of token ids")
}

// answerTokenIDs reads a render service's answer's token_ids (non-negative integers below
// wire.MaxAnswerTokenID) and, when they are written as the legs send them (body.AppendInts's
// form, as vLLM's JSON is), their JSON: not written again.
func answerTokenIDs(answer *body.Object) ([]int, json.RawMessage, error) {
	raw, _ := answer.Get("token_ids")
	ids, canonical, err := wire.ParseTokenIDs(raw, wire.MaxAnswerTokenID)
	if err != nil {
		return nil, nil, fmt.Errorf("token_ids %w", err)
	}
	if !canonical {
		raw = nil
	}
	return ids, raw, nil
}

// Conversation renders a conversational request, in process or through the chat render
// service: msgs is its chat body (the client's own, or a Responses request's messages).
func (s *renderStep) Conversation(ctx context.Context, rc *request.Context, msgs *body.Object) error {
	var split []json.RawMessage // msgs' messages, as the scan split them
	if !rc.MediaScanned {
		entries, elems, err := media.Scan(rc.Body, *wire.Of(rc.API).Media())
		if err != nil {
			return err
		}
		rc.Media, rc.MediaScanned = entries, true
		if msgs == rc.Body {
			split = elems
		}
	}
	if s.model != nil {
		why := localChatRefusal(rc, msgs)
		if why == "" {
			return s.chatLocal(ctx, rc, msgs, split)
		}
		if s.client == nil {
			return apierror.BadRequest("not_renderable", "this pipeline renders text in process and has no render service for %s", why)
		}
	}
	out, err := s.call(ctx, rc, renderChatPath, msgs)
	if err != nil {
		return err
	}
	// The answer is parsed as a request body is (validated once, members split): a 32k prompt's
	// ids through encoding/json cost more than the rest of the round trip.
	answer, err := body.Parse(out)
	var ids []int
	var js json.RawMessage
	if err == nil {
		ids, js, err = answerTokenIDs(answer)
	}
	if err != nil {
		return &apierror.UpstreamError{Phase: RenderStep, Status: 200, Body: upstream.Head(out), Err: fmt.Errorf("decoding answer: %w", err)}
	}
	if err := s.checkTokens(len(ids)); err != nil {
		return err
	}
	rc.SetTokenIDsJSON(ids, js)
	var rendered []request.MediaEntry
	if rawF, ok := answer.Get("features"); ok && body.KindOf(rawF) != body.KindNull {
		var features wire.Features
		if err := json.Unmarshal(rawF, &features); err != nil {
			return &apierror.UpstreamError{Phase: RenderStep, Status: 200, Body: upstream.Head(out), Err: fmt.Errorf("decoding answer: features: %w", err)}
		}
		if rendered, err = features.Entries(); err != nil {
			return &apierror.UpstreamError{Phase: RenderStep, Status: 200, Err: fmt.Errorf("features.%w", err)}
		}
	}
	if err := alignMedia(rc.Media, rendered); err != nil {
		return &apierror.UpstreamError{Phase: RenderStep, Status: 200, Err: err}
	}
	return s.checkPlaceholders(rc, false)
}

// localChatRefusal says what in a chat request the in-process renderer does not render ("" when
// it renders it all): media, and the fields vLLM accepts but a model's chat template alone does
// not cover (a request's own chat template, which vLLM refuses unless trusted; documents).
func localChatRefusal(rc *request.Context, msgs *body.Object) string {
	switch {
	case len(rc.Media) > 0:
		return "media (images, audio, video)"
	case msgs.Kind("chat_template") != body.KindNone && msgs.Kind("chat_template") != body.KindNull:
		return "a request's own chat_template"
	case msgs.Kind("documents") != body.KindNone && msgs.Kind("documents") != body.KindNull:
		return "documents"
	}
	return ""
}

// chatLocal renders msgs, a chat body, in process; split, when not nil, is its messages' elements.
func (s *renderStep) chatLocal(ctx context.Context, rc *request.Context, msgs *body.Object, split []json.RawMessage) error {
	req := render.ChatRequest{AddGenerationPrompt: true, Split: split}
	req.Messages, _ = msgs.Get("messages")
	if tools, ok := msgs.Get("tools"); ok && body.KindOf(tools) != body.KindNull {
		req.Tools = tools
	}
	for _, f := range []struct {
		key string
		dst *bool
	}{{"add_generation_prompt", &req.AddGenerationPrompt}, {"continue_final_message", &req.ContinueFinalMessage}, {"add_special_tokens", &req.AddSpecialTokens}} {
		b, present, err := msgs.Bool(f.key)
		if err != nil {
			return apierror.InvalidField(f.key, "%v", err)
		}
		if present {
			*f.dst = b
		}
	}
	if kw, _ := msgs.Get("chat_template_kwargs"); body.KindOf(kw) != body.KindNone && body.KindOf(kw) != body.KindNull {
		if body.KindOf(kw) != body.KindObject {
			return apierror.InvalidField("chat_template_kwargs", "\"chat_template_kwargs\" must be an object")
		}
		req.Kwargs = map[string]json.RawMessage{}
		for k, v := range body.Members(kw) {
			switch {
			case slices.Contains(reservedTemplateKwargs, k) || strings.HasPrefix(k, "__"):
				return apierror.InvalidField("chat_template_kwargs", "%q cannot be set in chat_template_kwargs: the renderer sets it from the request itself", k)
			case s.kwargs[k]:
				req.Kwargs[k] = v
			}
			// Others are dropped, as vLLM drops the kwargs its template does not read.
		}
	}
	req.Limits = s.limitsFor(ctx)
	size := len(req.Messages) + len(req.Tools)
	for _, v := range req.Kwargs {
		size += len(v)
	}
	if err := s.reserve(rc, size); err != nil {
		return err
	}
	toks, err := s.model.ChatTokens(req)
	n := toks.Len()
	s.keep(ctx, size, n)
	if err != nil {
		return s.renderErr(rc, err)
	}
	if err := s.checkTokens(n); err != nil {
		return err
	}
	rc.SetTokenChunks(toks.Shared, toks.Own, toks.JSON) // a later turn's history goes to the legs as the cache holds it
	return nil
}

// reserve holds the peak of an in-process render of size bytes of input, or refuses the request:
// with a 400 over max_input_size (which no budget would hold), else with a 429 when the budget
// cannot hold it now (nothing queues).
func (s *renderStep) reserve(rc *request.Context, size int) error {
	if size > s.limits.MaxInputBytes {
		return s.renderErr(rc, &render.LimitError{Limit: "MaxInputBytes",
			Message: fmt.Sprintf("input of %d bytes exceeds the limit of %d", size, s.limits.MaxInputBytes)})
	}
	if s.inFlight.Reserve(int64(size)*renderCostPerByte, s.maxInFlight) {
		return nil
	}
	return &apierror.Error{Status: http.StatusTooManyRequests, Type: apierror.TypeUnavailable, Code: "render_capacity_exhausted",
		Message: fmt.Sprintf("the coordinator renders as much as it may for requests in flight (%s); retry shortly", s.keys["MaxInFlight"]), RetryAfter: time.Second}
}

// keep lets go of a finished render's peak (reserve(size)) but for its tokens' ids, which the
// request holds until ctx ends.
func (s *renderStep) keep(ctx context.Context, size, tokens int) {
	peak := int64(size) * renderCostPerByte
	kept := min(int64(tokens)*tokenCost, peak)
	s.inFlight.Release(peak - kept)
	if ctx.Done() == nil {
		s.inFlight.Release(kept) // nothing tells when the request ends (embedders only)
		return
	}
	context.AfterFunc(ctx, func() { s.inFlight.Release(kept) })
}

// limitsFor are the in-process render's limits for a request whose context is ctx.
func (s *renderStep) limitsFor(ctx context.Context) render.Limits {
	l := s.limits
	l.Encode.Context = ctx
	return l
}

// renderErr is the client's error for an in-process render that failed: a limit (400 naming its
// key), the template's refusal, or the client's leaving (its context's error).
func (s *renderStep) renderErr(rc *request.Context, err error) error {
	var le *render.LimitError
	if errors.As(err, &le) {
		if key := s.keys[le.Limit]; key != "" {
			if le.Limit == "MaxTokens" {
				return apierror.BadRequest("too_many_tokens", "too many total tokens: %s (%s)", le.Message, key)
			}
			return apierror.BadRequest("render_limit", "the request is over a limit of in-process rendering: %s (%s)", le.Message, key)
		}
		return apierror.BadRequest("not_renderable", "the conversation cannot be rendered: %s", le.Message)
	}
	var te *chattemplate.TemplateError
	var ie *chattemplate.InputError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.As(err, &te):
		return apierror.BadRequest("chat_template_error", "the chat template refused the conversation: %s", te.Message)
	case errors.As(err, &ie):
		return apierror.BadRequest("not_renderable", "the conversation cannot be rendered: %s", ie.Message)
	}
	// The template failed on a shape of the conversation it does not handle: the detail (the
	// template's file, the engine's words) is logged, not sent.
	rc.Log.Info("in-process render failed", "error", err.Error())
	return apierror.BadRequest("not_renderable", "the model's chat template cannot render this conversation")
}

// alignMedia copies the render service's per-item hash, placeholder, kwargs and metadata onto the
// request's items, modality by modality in document order; the counts must agree.
func alignMedia(items, rendered []request.MediaEntry) error {
	next := map[string]int{}
	byMod := map[string][]int{}
	for i := range rendered {
		m := media.Modality(rendered[i].Kind)
		byMod[m] = append(byMod[m], i)
	}
	for i := range items {
		m := media.Modality(items[i].Kind)
		k := next[m]
		if k >= len(byMod[m]) {
			return fmt.Errorf("render returned %d %s items, the request has more", len(byMod[m]), m)
		}
		r := rendered[byMod[m][k]]
		items[i].Hash, items[i].Placeholder, items[i].Kwargs, items[i].Metadata = r.Hash, r.Placeholder, r.Kwargs, r.Metadata
		next[m] = k + 1
	}
	for m, idx := range byMod {
		if next[m] != len(idx) {
			return fmt.Errorf("render returned %d %s items, the request has %d", len(idx), m, next[m])
		}
	}
	return nil
}

// call sends obj to the render service under gateway.retry and returns the answer.
func (s *renderStep) call(ctx context.Context, rc *request.Context, path string, obj *body.Object) ([]byte, error) {
	return gateway.Do(ctx, s.retrier, rc.Log, func(int) ([]byte, error) {
		r := gateway.Outbound(rc, RenderStep, path, obj)
		r.MaxResponse = s.maxResponse
		out, err := s.client.Call(ctx, r)
		return out, retry.IfUnserved(ctx, RenderStep, err)
	}, nil)
}
