package simworker

import (
	"net/http"
	"strings"
)

// handleInference returns the handler of one inference endpoint.
func (w *Worker) handleInference(kind apiKind) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		if w.cfgErr != nil {
			writeError(rw, http.StatusInternalServerError, "simworker misconfigured: "+w.cfgErr.Error())
			return
		}
		detail := imageSize
		if w.cfg.Role == RoleEncode {
			detail = imageDigest // for the encoder output
		}
		in, err := parseInferenceImages(kind, requestBody(r), detail)
		if err == nil {
			err = in.checkModel(w.cfg.ModelName)
		}
		if err != nil {
			writeAPIError(rw, err)
			return
		}
		if w.cfg.Role == RoleEncode {
			w.serveEncode(rw, r, in)
			return
		}
		if kind == kindChat {
			if err := in.checkChatFeatures(); err != nil {
				writeAPIError(rw, err)
				return
			}
		}
		w.servePrefillDecode(rw, r, in)
	}
}

// servePrefillDecode serves a request on a prefill, decode or both worker.
func (w *Worker) servePrefillDecode(rw http.ResponseWriter, r *http.Request, in *inference) {
	lg, err := w.legOf(in)
	if err != nil {
		writeAPIError(rw, err)
		return
	}
	if err := w.checkLeg(lg, in); err != nil {
		writeAPIError(rw, err)
		return
	}
	if PreferIfAvailable(r.Header) && !w.cache.contains(in.promptKey) {
		writeError(rw, http.StatusPreconditionFailed, "prompt not in prefix cache (Prefer: if-available)")
		return
	}
	ctx := r.Context()
	var kvOut any
	switch lg {
	case legPrefill:
		if err := w.verifyEC(ctx, in, true); err != nil {
			writeAPIError(rw, err)
			return
		}
		if kvOut, err = w.producePrefillKV(r, in); err != nil {
			writeAPIError(rw, err)
			return
		}
	case legRemotePrefill:
		if recomputes(ctx) {
			in.recomputed = true // the transfer is ignored: the prompt is computed here
			break
		}
		if err := w.verifyKV(ctx, in); err != nil {
			writeAPIError(rw, err)
			return
		}
		in.kvLoaded = true
	default:
		if err := w.verifyEC(ctx, in, false); err != nil {
			writeAPIError(rw, err)
			return
		}
	}
	in.cachedPrompt = w.cache.contains(in.promptKey)
	w.cache.put(in.promptKey, struct{}{})
	w.respond(rw, r, in, kvOut, nil)
}

// legOf classifies the request: by its kv_transfer_params, or for a leg with SGLang's own
// bootstrap fields and no transfer params, by the worker's role (an SGLang server runs in
// prefill or decode disaggregation mode).
func (w *Worker) legOf(in *inference) (leg, *apiError) {
	if in.bootstrap == nil || in.kv != nil {
		return in.leg()
	}
	switch w.cfg.Role {
	case RolePrefill:
		return legPrefill, nil
	case RoleDecode:
		return legRemotePrefill, nil
	}
	return 0, badRequest("worker %s (role %s) cannot serve a leg of SGLang disaggregation (bootstrap_room): it takes a prefill or a decode worker", w.cfg.Name, w.cfg.Role)
}

// checkLeg enforces which legs the worker's role accepts and the static
// shape of a prefill leg.
func (w *Worker) checkLeg(lg leg, in *inference) *apiError {
	switch {
	case w.cfg.Role == RolePrefill && lg != legPrefill:
		return badRequest("prefill worker %s accepts only prefill legs (%s.do_remote_decode=true)", w.cfg.Name, in.kvName)
	case w.cfg.Role == RoleDecode && lg == legPrefill:
		return badRequest("decode worker %s does not accept prefill legs (%s.do_remote_decode=true)", w.cfg.Name, in.kvName)
	}
	if lg != legPrefill {
		return nil
	}
	if err := in.requireSingleToken("prefill"); err != nil {
		return err
	}
	return w.checkPrefillKV(in)
}

// PreferIfAvailable reports whether the Prefer header asks for if-available
// (RFC 7240 preference token, case-insensitive).
func PreferIfAvailable(h http.Header) bool {
	for _, v := range h.Values("Prefer") {
		for _, pref := range strings.Split(v, ",") {
			token, _, _ := strings.Cut(pref, ";")
			token, _, _ = strings.Cut(token, "=")
			if strings.EqualFold(strings.TrimSpace(token), "if-available") {
				return true
			}
		}
	}
	return false
}
