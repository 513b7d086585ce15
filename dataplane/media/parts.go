// Package media is the coordinator's media room: what a conversational request's content parts
// carry (the kinds of media part, image, audio and video, and where a format lays them out),
// the walk that finds them and the URLs that must not reach a worker, and the Inliner behind
// the replace-media-urls step: the SSRF guard on every dialled address, downloads bounded per
// item, per request and per process (budget), content sniffing, and inlining as data: URLs.
package media

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/observe"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// mediaKind is one kind of media a chat content part can carry. A part is of a kind when it has
// the kind's member (field) or its "type" (vLLM reads the member of an untyped part, and of any
// part with a "uuid", whatever its type).
type mediaKind struct {
	// partType is the canonical "type" (and MediaEntry.Kind); field is the member holding the
	// media: {"url": ...} or a plain URL string, or {"data": ...} for a data-only kind.
	partType, field string
	// aliases are other "type" values of the kind (Responses-style input_image).
	aliases []string
	// modality is the kind's feature key (image, audio, video): its media types, limits and
	// render features are the modality's (see modalities).
	modality string
	// dataOnly kinds carry base64 data, never a URL (input_audio).
	dataOnly bool
	// entry kinds are collected as rc.Media for render and encode (one encode leg per item); the
	// others would be inlined too and reach the workers as data only.
	entry bool
	// refused, when set, is why parts of the kind are refused.
	refused string
}

// The modalities: vLLM's feature keys (mm_hashes.image, .audio, .video).
const (
	modImage = observe.ModalityImage
	modAudio = observe.ModalityAudio
	modVideo = observe.ModalityVideo
)

// modalities lists the modalities in the order params and messages name them.
var modalities = []string{modAudio, modImage, modVideo}

// defaultTypes are the media types each modality accepts in data: URLs, downloads and
// input_audio formats unless replace-media-urls' modalities.<m>.allowed_types says otherwise.
var defaultTypes = map[string][]string{
	modImage: {"image/jpeg", "image/png", "image/gif", "image/webp"},
	modVideo: {"video/mp4", "video/webm", "video/quicktime"},
	modAudio: {"audio/wav", "audio/wave", "audio/x-wav", "audio/mpeg", "audio/mp3", "audio/ogg", "audio/flac", "audio/webm", "audio/mp4"},
}

const (
	refusedEmbeds = "embedding inputs are not accepted; send the media itself"
	refusedFile   = "file parts are not supported; send media as image_url, video_url, audio_url or input_audio"
)

var mediaKinds = []mediaKind{
	{partType: "image_url", field: "image_url", aliases: []string{"input_image"}, modality: modImage, entry: true},
	{partType: "video_url", field: "video_url", modality: modVideo, entry: true},
	{partType: "audio_url", field: "audio_url", modality: modAudio, entry: true},
	{partType: "input_audio", field: "input_audio", modality: modAudio, dataOnly: true, entry: true},
	{partType: "image_embeds", field: "image_embeds", refused: refusedEmbeds},
	{partType: "audio_embeds", field: "audio_embeds", refused: refusedEmbeds},
	{partType: "video_embeds", field: "video_embeds", refused: refusedEmbeds},
	{partType: "prompt_embeds", field: "prompt_embeds", refused: refusedEmbeds},
	{partType: "image_pil", field: "image_pil", refused: "image_pil is not an HTTP input; send an image_url"},
	{partType: "file", field: "file", refused: refusedFile},
	{partType: "file_url", field: "file_url", refused: refusedFile},
}

// Layout is where a conversational format carries its conversation and the shape of its parts.
type Layout struct {
	// Messages is the body member holding the conversation's items (messages; input for the
	// Responses API).
	Messages string
	// Input says that the parts have the Responses API's shapes: media only as input_image
	// (its URL a plain string) or input_audio.
	Input bool
}

// inputTypes are the media part types of an Input layout (each written in its own shape:
// input_image with its URL as a string, input_audio with its data).
var inputTypes = []string{"input_image", "input_audio"}

// textTypes are the content-part types without media; vLLM never fetches anything for them.
var textTypes = []string{"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"}

// kindOf returns the kind of a canonical part type (a MediaEntry.Kind).
func kindOf(partType string) *mediaKind {
	for i := range mediaKinds {
		if mediaKinds[i].partType == partType {
			return &mediaKinds[i]
		}
	}
	return nil
}

// Modality maps a content-part type (a MediaEntry.Kind) to the feature key vLLM uses: image,
// audio (audio_url and input_audio alike) or video.
func Modality(kind string) string {
	if k := kindOf(kind); k != nil && k.modality != "" {
		return k.modality
	}
	return modImage
}

// Field is the member of a part of kind (a MediaEntry.Kind) that holds its media: its URL object,
// or input_audio's data.
func Field(kind string) string {
	if k := kindOf(kind); k != nil {
		return k.field
	}
	return kind
}

// KindOf is the part type an item of a modality takes when it comes without a part of its own
// (a tokens-in request's features): image_url, input_audio or video_url.
func KindOf(modality string) string {
	switch modality {
	case modVideo:
		return "video_url"
	case modAudio:
		return "input_audio"
	}
	return "image_url"
}

// kindByType returns the kind a part's "type" names, aliases included.
func kindByType(typ string) *mediaKind {
	for i := range mediaKinds {
		if k := &mediaKinds[i]; k.partType == typ || slices.Contains(k.aliases, typ) {
			return k
		}
	}
	return nil
}

// mediaItem is one media content part, as the walker found it.
type mediaItem struct {
	// key is the body member of the messages (Layout.Messages); input says the parts keep the
	// Responses API's own shape (Layout.Input).
	key       string
	input     bool
	msg, part int
	// kind is nil for a part refused for carrying a URL outside any media member.
	kind *mediaKind
	// label names the part in messages: its type, else its media member.
	label string
	// raw is the part, a subslice of the messages value; obj is raw parsed.
	raw json.RawMessage
	obj *body.Object
	// url is the URL (the base64 data for a data-only kind); urlRaw is its JSON string token.
	url    string
	urlRaw json.RawMessage
	// inner is the media member when it is an object, nil for a plain URL string.
	inner *body.Object
	// canonical parts are {"type": partType, field: {"url": ...}} already (data-only: always).
	canonical bool
	// problem, when set, is why the part is refused (client-facing).
	problem string

	// Set by replace-media-urls: the media type and decoded size; for a download (fetched), the
	// bytes until they are written into the body.
	contentType string
	size        int64
	fetched     bool
	data        [][]byte
}

func (it *mediaItem) where() string {
	return fmt.Sprintf("%s[%d].content[%d] (%s)", it.key, it.msg, it.part, it.label)
}

// chatMessages returns the raw value of the messages member key of a conversational body
// (Layout.Messages) and its elements; both are nil when the body has no such array (a
// Responses input string; the worker reports a malformed one).
func chatMessages(obj *body.Object, key string) (json.RawMessage, []json.RawMessage, error) {
	raw, ok := obj.Get(key)
	if !ok || body.KindOf(raw) != body.KindArray {
		return nil, nil, nil
	}
	msgs, err := body.Array(raw)
	if err != nil {
		return nil, nil, apierror.InvalidField(key, "%q must be an array", key)
	}
	return raw, msgs, nil
}

// partsContent reports whether a message's content (its last, as a parse keeps) is a list of
// parts, without parsing the message: a message with no array value is found by memchr (a
// bracket in its text is not one), else its members are scanned, nothing allocated (the body
// passed body.Valid, so every key decodes).
func partsContent(msg []byte) bool {
	if !arrayValue(msg) {
		return false
	}
	array := false
	for key, value := range body.Members(msg) {
		if key == "content" {
			array = body.KindOf(value) == body.KindArray
		}
	}
	return array
}

// arrayValue reports whether the JSON object msg may have a member whose value is an array: a
// '[' after a ':' (JSON whitespace between). A member's value follows its colon, so an object
// without one has none; a string may hold one too (text such as "a: [1]"), which costs only the
// scan partsContent would have made anyway.
func arrayValue(msg []byte) bool {
	for i := 0; ; i++ {
		j := bytes.IndexByte(msg[i:], '[')
		if j < 0 {
			return false
		}
		i += j
		k := i - 1
		for k > 0 && (msg[k] == ' ' || msg[k] == '\t' || msg[k] == '\n' || msg[k] == '\r') {
			k--
		}
		if k > 0 && msg[k] == ':' {
			return true
		}
	}
}

// walk walks messages[*].content[*] of a chat body, or input[*].content[*] of a Responses
// body (l: the only places these APIs carry media; completions and generate carry none) and
// returns every media part, and every part refused for carrying a URL elsewhere, in document
// order.
func walk(obj *body.Object, l Layout) ([]mediaItem, error) {
	items, _, err := walkMessages(obj, l)
	return items, err
}

// walkMessages is walk, and returns the messages (or input items) it split too.
func walkMessages(obj *body.Object, l Layout) ([]mediaItem, []json.RawMessage, error) {
	key := l.Messages
	_, msgs, err := chatMessages(obj, key)
	if err != nil {
		return nil, nil, err
	}
	var out []mediaItem
	for mi, rawMsg := range msgs {
		if body.KindOf(rawMsg) != body.KindObject {
			return nil, nil, apierror.InvalidField(key, "%s[%d] must be an object", key, mi)
		}
		if !partsContent(rawMsg) {
			continue // plain string content carries no media
		}
		msg, err := body.ParseNested(rawMsg)
		if err != nil {
			return nil, nil, apierror.InvalidField(key, "%s[%d]: %v", key, mi, err)
		}
		rawContent, ok := msg.Get("content")
		if !ok || body.KindOf(rawContent) != body.KindArray {
			continue // plain string content carries no media
		}
		parts, err := body.Array(rawContent)
		if err != nil {
			return nil, nil, apierror.InvalidField(key, "%s[%d].content must be an array", key, mi)
		}
		for pi, rawPart := range parts {
			if body.KindOf(rawPart) != body.KindObject {
				continue // a string part is text; anything else the worker rejects
			}
			part, err := body.ParseNested(rawPart)
			if err != nil {
				continue
			}
			it := mediaItem{key: key, input: l.Input, msg: mi, part: pi, raw: rawPart, obj: part}
			if classify(&it) {
				out = append(out, it)
			}
		}
	}
	return out, msgs, nil
}

// classify fills in it from its part and reports whether the part is media (or refused).
func classify(it *mediaItem) bool {
	p := it.obj
	typ, _, err := p.String("type")
	if err != nil {
		it.label, it.problem = "invalid type", `"type" must be a string`
		return true
	}
	var k *mediaKind
	for i := range mediaKinds {
		if !p.Has(mediaKinds[i].field) {
			continue
		}
		if k != nil {
			it.label = cmp.Or(typ, k.field)
			it.problem = fmt.Sprintf("a content part carries one media member, not both %s and %s", k.field, mediaKinds[i].field)
			return true
		}
		k = &mediaKinds[i]
	}
	byType := kindByType(typ)
	switch {
	case k == nil && byType != nil && byType.refused != "":
		k = byType
	case k == nil:
		if slices.Contains(textTypes, typ) || !urlOutside(p, "") {
			return false
		}
		it.label = cmp.Or(typ, "no type")
		it.problem = "a URL is only accepted in an image_url, video_url or audio_url member"
		return true
	case typ != "" && byType != k:
		it.label = typ
		it.problem = fmt.Sprintf("a %q part cannot carry a %s member", typ, k.field)
		return true
	}
	it.kind, it.label = k, cmp.Or(typ, k.field)
	if k.refused != "" {
		it.problem = k.refused
		return true
	}
	if it.input && !slices.Contains(inputTypes, typ) {
		it.problem = "the Responses API takes media as input_image or input_audio parts"
		return true
	}
	raw, _ := p.Get(k.field)
	switch body.KindOf(raw) {
	case body.KindString:
		if k.dataOnly {
			break
		}
		it.url, _, _ = p.String(k.field)
		it.urlRaw = raw
		it.canonical = it.input // the Responses API's own shape: a plain URL string
	case body.KindObject:
		it.inner, _ = body.ParseNested(raw)
		key := "url"
		if k.dataOnly {
			key = "data"
		}
		if u, ok := it.inner.Get(key); ok && body.KindOf(u) == body.KindString {
			it.url, _, _ = it.inner.String(key)
			it.urlRaw = u
		}
		it.canonical = k.dataOnly || (typ == k.partType && !it.input)
	}
	switch {
	case k.dataOnly && (it.inner == nil || urlOutside(it.inner, "")):
		it.problem = k.field + ` takes {"data": <base64>, "format": ...}, not a URL`
	case it.urlRaw == nil && k.dataOnly:
		it.problem = k.field + ` has no "data" string`
	case it.urlRaw == nil:
		it.problem = k.field + ` must be a URL string or {"url": <string>}`
	case it.url == "":
		it.problem = k.field + " has an empty URL"
	case urlOutside(p, k.field) || (!k.dataOnly && it.inner != nil && urlOutside(it.inner, "url")):
		it.problem = "a URL is only accepted as the media URL itself"
	}
	return true
}

// urlOutside reports whether o has a member that holds a URL (urlKey) other than skip,
// at its top level or one level down.
func urlOutside(o *body.Object, skip string) bool {
	for _, f := range o.Fields() {
		if f.Key == skip {
			continue
		}
		if urlKey(f.Key) {
			return true
		}
		if body.KindOf(f.Value) == body.KindObject {
			if inner, err := body.ParseNested(f.Value); err == nil {
				for _, g := range inner.Fields() {
					if urlKey(g.Key) {
						return true
					}
				}
			}
		}
	}
	return false
}

// Scan returns one entry per media part of an entry kind (images, audio and video) of obj, laid
// out as l, in document order, with its URL (an input_audio's base64 data); parts the walker
// would refuse are left out. It is render's fallback when no replace-media-urls step ran: the
// URLs are then the client's own, remote ones included. It returns the elements of obj's messages
// array (l.Messages) too, as it split them (nil when there is none), for a caller that walks
// them next.
func Scan(obj *body.Object, l Layout) ([]request.MediaEntry, []json.RawMessage, error) {
	items, msgs, err := walkMessages(obj, l)
	if err != nil {
		return nil, nil, err
	}
	var out []request.MediaEntry
	for _, it := range items {
		if it.problem == "" && it.kind.entry {
			out = append(out, request.MediaEntry{Message: it.msg, Part: it.part, Kind: it.kind.partType, URL: it.url})
		}
	}
	return out, msgs, nil
}

// SetUUIDs gives each rendered media part of obj, a conversational body laid out as l, its
// entry's mm_hash as "uuid" (vLLM's multimodal item id). The few inserted bytes are spliced
// between segments of the original messages value, so a megabyte image is not copied; a part that
// already has a uuid (the client's) is rewritten instead, replacing it.
func SetUUIDs(obj *body.Object, l Layout, media []request.MediaEntry) error {
	if len(media) == 0 {
		return nil
	}
	key := l.Messages
	rawMsgs, msgs, err := chatMessages(obj, key)
	if err != nil || msgs == nil {
		return err
	}
	segs := make([][]byte, 0, 2*len(media)+1)
	last := 0
	for i := range media {
		m := &media[i]
		if m.Hash == "" {
			continue
		}
		part, err := partRaw(msgs, m)
		if err != nil {
			return err
		}
		p, _ := body.ParseNested(part)
		off := body.Offset(rawMsgs, part)
		if p == nil || p.Has("uuid") || off < last {
			return setUUIDsByRewrite(obj, key, media)
		}
		end := off + len(part) - 1 // the part's closing brace
		insert := `,"uuid":`
		if p.Len() == 0 {
			insert = `"uuid":`
		}
		segs = append(segs, rawMsgs[last:end], body.AppendQuote([]byte(insert), m.Hash))
		last = end
	}
	if last == 0 {
		return nil
	}
	obj.SetSegments(key, append(segs, rawMsgs[last:])...)
	return nil
}

// setUUIDsByRewrite is SetUUIDs for parts that already carry a uuid: they are decoded and
// re-assembled.
func setUUIDsByRewrite(obj *body.Object, key string, media []request.MediaEntry) error {
	return editParts(obj, key, media, func(part *body.Object, m *request.MediaEntry) error {
		if m.Hash != "" {
			part.Set("uuid", body.AppendQuote(nil, m.Hash))
		}
		return nil
	})
}

// partRaw returns the raw content part of an entry (a subslice of msgs' values).
func partRaw(msgs []json.RawMessage, m *request.MediaEntry) (json.RawMessage, error) {
	if m.Message < 0 || m.Message >= len(msgs) {
		return nil, errMediaMissing
	}
	msg, err := body.ParseNested(msgs[m.Message])
	if err != nil {
		return nil, err
	}
	rawContent, _ := msg.Get("content")
	parts, err := body.Array(rawContent)
	if err != nil || m.Part < 0 || m.Part >= len(parts) {
		return nil, errMediaMissing
	}
	return parts[m.Part], nil
}

// Part returns the raw value of an entry's part member (e.g. the image_url object) in msgs, the
// conversation's items.
func Part(msgs []json.RawMessage, m *request.MediaEntry) (json.RawMessage, error) {
	part, err := partRaw(msgs, m)
	if err != nil {
		return nil, err
	}
	obj, err := body.ParseNested(part)
	if err != nil {
		return nil, err
	}
	raw, ok := obj.Get(kindOf(m.Kind).field)
	if !ok {
		return nil, errMediaMissing
	}
	if body.KindOf(raw) == body.KindString {
		// A plain URL string (no replace-media-urls step made the part canonical).
		return slices.Concat([]byte(`{"url":`), raw, []byte("}")), nil
	}
	return raw, nil
}

var errMediaMissing = apierror.BadRequest("invalid_media", "media part not found in messages")

// editParts applies fn to <key>[m.Message].content[m.Part] for each entry and writes the edited
// messages back into obj.
func editParts(obj *body.Object, key string, media []request.MediaEntry, fn func(part *body.Object, m *request.MediaEntry) error) error {
	_, msgs, err := chatMessages(obj, key)
	if err != nil || msgs == nil {
		return err
	}
	byMsg := map[int][]int{}
	for i := range media {
		if media[i].Message >= 0 && media[i].Message < len(msgs) {
			byMsg[media[i].Message] = append(byMsg[media[i].Message], i)
		}
	}
	for mi, entries := range byMsg {
		msg, err := body.ParseNested(msgs[mi])
		if err != nil {
			return apierror.InvalidField(key, "%s[%d] must be an object", key, mi)
		}
		rawContent, _ := msg.Get("content")
		parts, err := body.Array(rawContent)
		if err != nil {
			continue // string content has no parts
		}
		for _, ei := range entries {
			m := &media[ei]
			if m.Part < 0 || m.Part >= len(parts) {
				continue
			}
			part, err := body.ParseNested(parts[m.Part])
			if err != nil {
				continue
			}
			if err := fn(part, m); err != nil {
				return err
			}
			parts[m.Part] = part.Bytes()
		}
		msg.Set("content", body.AppendArray(nil, parts))
		msgs[mi] = msg.Bytes()
	}
	obj.Set(key, json.RawMessage(body.AppendArray(nil, msgs)))
	return nil
}
