package media

import (
	"encoding/base64"
	"errors"
	"mime"
	"net/http"
	"slices"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/config"
	"github.com/epd-dev/coordinator/dataplane/base/params"
	"github.com/epd-dev/coordinator/dataplane/state/body"
)

// paramModalities is replace-media-urls' per-modality overrides: modalities.<image|audio|video>
// with max_size (MiB), max_items and allowed_types.
const paramModalities = "modalities"

// mediaLimits are what replace-media-urls accepts of one modality.
type mediaLimits struct {
	// maxSize bounds one item (bytes); sizeParam names the param that set it, for messages.
	maxSize   int64
	sizeParam string
	// maxItems bounds the modality's items per request; itemsParam names its param.
	maxItems   int
	itemsParam string
	// types are the media types accepted in data: URLs, downloads and input_audio formats.
	types []string
}

// modalityLimits reads the modalities param: every modality starts from the step-wide limits
// (max_download_size, max_multimodal_entries, defaultTypes) and may override them. Errors name
// the key, e.g. pipeline.steps[0].params.modalities.audio.max_size.
func modalityLimits(p *params.Params, maxItem, maxRequest int64, maxEntries int) map[string]*mediaLimits {
	out := make(map[string]*mediaLimits, len(modalities))
	for _, m := range modalities {
		out[m] = &mediaLimits{maxSize: maxItem, sizeParam: "max_download_size", maxItems: maxEntries, itemsParam: "max_multimodal_entries",
			types: defaultTypes[m]}
	}
	v, ok := p.Value(paramModalities)
	if !ok {
		return out
	}
	raw, isMap := v.(map[string]any)
	if !isMap {
		p.Fail(paramModalities, "must be a mapping of modality (%s) to its limits, got %T", strings.Join(modalities, ", "), v)
		return out
	}
	mods := params.New(p.Key(paramModalities), raw, nil)
	shown := map[string]any{}
	for _, m := range modalities {
		l := out[m]
		shown[m] = map[string]any{"max_size": int(l.maxSize >> 20), "max_items": l.maxItems, "allowed_types": l.types}
		mv, set := mods.Value(m)
		if !set {
			continue
		}
		mm, isMap := mv.(map[string]any)
		if !isMap {
			mods.Fail(m, "must be a mapping of max_size, max_items and allowed_types, got %T", mv)
			continue
		}
		mp := params.New(mods.Key(m), mm, nil)
		key := paramModalities + "." + m + "."
		if mp.Has("max_size") {
			n := mp.Int("max_size", 1, 1)
			switch {
			case n > maxMiB:
				mp.Fail("max_size", "must be at most %d (MiB), got %d", maxMiB, n)
			case int64(n)<<20 > maxRequest:
				mp.Fail("max_size", "must be at most max_request_media_size (%d MiB): a larger item is refused by that limit first", maxRequest>>20)
			default:
				l.maxSize, l.sizeParam = int64(n)<<20, key+"max_size"
			}
		}
		if mp.Has("max_items") {
			n := mp.Int("max_items", 1, 1)
			if n > maxEntries {
				mp.Fail("max_items", "must be at most max_multimodal_entries (%d): more items are refused by that limit first", maxEntries)
			} else {
				l.maxItems, l.itemsParam = n, key+"max_items"
			}
		}
		if mp.Has("allowed_types") {
			if types := allowedTypesParam(mp, m); types != nil {
				l.types = types
			}
		}
		shown[m] = map[string]any{"max_size": int(l.maxSize >> 20), "max_items": l.maxItems, "allowed_types": l.types}
		failInto(p, mp)
	}
	failInto(p, mods)
	p.Redact(paramModalities, shown)
	return out
}

// allowedTypesParam reads allowed_types of modality m: a non-empty list of media types of m
// (image/..., audio/..., video/...), without parameters; nil after an error.
func allowedTypesParam(mp *params.Params, m string) []string {
	list := mp.StringList("allowed_types")
	if len(list) == 0 {
		mp.Fail("allowed_types", "must list at least one media type (leave it out for the defaults: %s)", strings.Join(defaultTypes[m], ", "))
		return nil
	}
	var types []string
	for i, t := range list {
		mt, params, err := mime.ParseMediaType(t)
		top, _, _ := strings.Cut(mt, "/")
		switch {
		case err != nil || !strings.Contains(mt, "/") || strings.TrimSpace(t) != t:
			mp.Fail("allowed_types", "item %d (%q) is not a media type such as %s", i, t, defaultTypes[m][0])
			return nil
		case len(params) > 0 || strings.Contains(t, ";"):
			mp.Fail("allowed_types", "item %d (%q) has parameters: list the media type alone", i, t)
			return nil
		case top != m:
			mp.Fail("allowed_types", "item %d (%q) is not a %s/* media type", i, t, m)
			return nil
		}
		if !slices.Contains(types, mt) {
			types = append(types, mt)
		}
	}
	return types
}

// failInto records the first error of a nested params block in p (keeping the first error of p
// the first one reported).
func failInto(p, nested *params.Params) {
	err := nested.Err()
	if err == nil {
		return
	}
	if fe := (*config.FieldError)(nil); errors.As(err, &fe) {
		p.FailAt(fe.Key, "%s", fe.Reason)
		return
	}
	p.FailAt(nested.Path(), "%v", err)
}

// sniffedTypes maps what content sniffing (http.DetectContentType) tells of an item's bytes to
// the media types they may be declared as: containers hold several modalities (a WebM or MP4
// audio file sniffs as video; Ogg as application/ogg), and some types have several names. A
// sniffed type not listed may be declared only as itself.
var sniffedTypes = map[string][]string{
	"audio/wave":      {"audio/wav", "audio/wave", "audio/x-wav"},
	"audio/mpeg":      {"audio/mpeg", "audio/mp3"},
	"audio/aiff":      {"audio/aiff", "audio/x-aiff"},
	"application/ogg": {"audio/ogg", "video/ogg", "application/ogg"},
	"video/webm":      {"video/webm", "audio/webm"},
	"video/mp4":       {"video/mp4", "audio/mp4"},
}

// sniffLen is how many leading bytes content sniffing reads.
const sniffLen = 512

// sniffMedia returns what the head of an item's bytes are, "" when sniffing cannot tell
// (application/octet-stream: raw frames, ID3-less MP3, a too short head).
func sniffMedia(head []byte) string {
	if len(head) == 0 {
		return ""
	}
	ct, _, _ := mime.ParseMediaType(http.DetectContentType(head))
	if ct == "application/octet-stream" {
		return ""
	}
	return ct
}

// asAllowed returns the first type of types that bytes sniffed as s may be declared as, "" when
// none.
func asAllowed(s string, types []string) string {
	names, ok := sniffedTypes[s]
	if !ok {
		names = []string{s}
	}
	for _, n := range names {
		if slices.Contains(types, n) {
			return n
		}
	}
	return ""
}

// base64Head decodes the first sniffLen bytes of a valid padded base64 payload (checked by
// base64Size): a prefix of whole quanta holds no padding, so it decodes alone.
func base64Head(payload string) []byte {
	n := min(len(payload), (sniffLen+2)/3*4)
	b, err := base64.StdEncoding.DecodeString(payload[:n])
	if err != nil {
		return nil
	}
	return b
}

// dataURLHead is base64Head of a data: URL's payload.
func dataURLHead(u string) []byte {
	_, payload, _ := strings.Cut(u, ",")
	return base64Head(payload)
}

// checkContent refuses an item whose bytes sniff as something its modality does not accept: a
// PNG in an audio data: URL, WAV bytes in a video_url, an HTML page. Within the modality the
// declared type is not held to the sniffed one (vLLM decodes media by their content, and a PNG
// sent as image/jpeg is a common client habit), but the bytes must be of an allowed type, so an
// allowlist restricts what the media are, not only their labels. Bytes sniffing cannot tell pass
// on their declared type.
func (s *Inliner) checkContent(it *mediaItem, head []byte) error {
	sniffed := sniffMedia(head)
	if sniffed == "" {
		return nil
	}
	lim := s.limits[it.kind.modality]
	if asAllowed(sniffed, lim.types) == "" {
		return apierror.InvalidField(it.key, "%s: the content is %s, not %s media of an accepted type (%s)", it.where(), sniffed, it.kind.modality,
			strings.Join(lim.types, ", "))
	}
	return nil
}

// audioFormat reads an input_audio's "format" (wav, mp3, ...: the subtype of an accepted audio
// type, case-insensitive) and returns its media type; "" when the part has none (vLLM accepts
// that: the data then goes by its content).
func (s *Inliner) audioFormat(it *mediaItem) (string, error) {
	raw, ok := it.inner.Get("format")
	if !ok || body.KindOf(raw) == body.KindNull {
		return "", nil
	}
	lim := s.limits[it.kind.modality]
	formats := make([]string, 0, len(lim.types))
	for _, t := range lim.types {
		formats = append(formats, strings.TrimPrefix(t, modAudio+"/"))
	}
	f, _, err := it.inner.String("format")
	if err != nil || f == "" {
		return "", apierror.InvalidField(it.key, "%s: %s \"format\" must be a string such as wav or mp3", it.where(), it.kind.field)
	}
	mt := modAudio + "/" + strings.ToLower(f)
	if !allowedType(mt, lim.types) {
		return "", apierror.InvalidField(it.key, "%s: %s format %q is not one of %s", it.where(), it.kind.field, f, strings.Join(formats, ", "))
	}
	return mt, nil
}

// checkCounts applies each modality's max_items to the request's media parts.
func (s *Inliner) checkCounts(items []mediaItem, key string) error {
	counts := map[string]int{}
	for i := range items {
		if k := items[i].kind; k != nil && k.modality != "" {
			counts[k.modality]++
		}
	}
	for _, m := range modalities {
		if lim := s.limits[m]; counts[m] > lim.maxItems {
			return apierror.InvalidField(key, "too many %s items: got %d, max %d (%s)", m, counts[m], lim.maxItems, lim.itemsParam)
		}
	}
	return nil
}
