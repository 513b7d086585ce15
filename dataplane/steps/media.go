package steps

import (
	"encoding/json"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/body"
	"github.com/epd-dev/coordinator/dataplane/request"
)

// mediaKind describes one multimodal content-part type of the chat format.
type mediaKind struct {
	// partType is the part's "type" and field the member holding {"url": ...}.
	partType, field string
	// mediaTypes are the data: URL media types accepted inline and after a download (prefix match
	// when ending in "/").
	mediaTypes []string
	// enabled kinds are collected as media entries; the others are recognised and left alone
	// until render, encode and the workers support them (adding one is a table change).
	enabled bool
}

var mediaKinds = []mediaKind{
	{partType: "image_url", field: "image_url", mediaTypes: []string{"image/jpeg", "image/png", "image/gif", "image/webp"}, enabled: true},
	{partType: "video_url", field: "video_url", mediaTypes: []string{"video/mp4", "video/webm"}},
	{partType: "input_audio", field: "input_audio"},
}

func kindOf(partType string) *mediaKind {
	for i := range mediaKinds {
		if mediaKinds[i].partType == partType {
			return &mediaKinds[i]
		}
	}
	return nil
}

// chatMessages returns the raw messages value of a chat body and its elements; both are nil when
// the body has no messages array (the worker reports a malformed one).
func chatMessages(obj *body.Object) (json.RawMessage, []json.RawMessage, error) {
	raw, ok := obj.Get("messages")
	if !ok || body.KindOf(raw) != body.KindArray {
		return nil, nil, nil
	}
	msgs, err := body.Array(raw)
	if err != nil {
		return nil, nil, apierror.InvalidField("messages", "\"messages\" must be an array")
	}
	return raw, msgs, nil
}

// scanMedia walks messages[*].content[*] of a chat body and returns one entry per enabled media
// part, in document order, with its URL. Parts of other shapes are left alone.
func scanMedia(obj *body.Object) ([]request.MediaEntry, error) {
	_, msgs, err := chatMessages(obj)
	if err != nil {
		return nil, err
	}
	var out []request.MediaEntry
	for mi, rawMsg := range msgs {
		if body.KindOf(rawMsg) != body.KindObject {
			return nil, apierror.InvalidField("messages", "messages[%d] must be an object", mi)
		}
		msg, err := body.ParseNested(rawMsg)
		if err != nil {
			return nil, apierror.InvalidField("messages", "messages[%d]: %v", mi, err)
		}
		rawContent, ok := msg.Get("content")
		if !ok || body.KindOf(rawContent) != body.KindArray {
			continue // plain string content carries no media
		}
		parts, err := body.Array(rawContent)
		if err != nil {
			return nil, apierror.InvalidField("messages", "messages[%d].content must be an array", mi)
		}
		for pi, rawPart := range parts {
			if body.KindOf(rawPart) != body.KindObject {
				continue
			}
			part, err := body.ParseNested(rawPart)
			if err != nil {
				continue
			}
			typ, _, _ := part.String("type")
			k := kindOf(typ)
			if k == nil || !k.enabled {
				continue
			}
			inner, _, err := part.Object(k.field)
			if err != nil || inner == nil {
				continue
			}
			url, _, err := inner.String("url")
			if err != nil || url == "" {
				continue
			}
			out = append(out, request.MediaEntry{Message: mi, Part: pi, Kind: typ, URL: url})
		}
	}
	return out, nil
}

// setMediaUUIDs gives each rendered media part of a chat body its mm_hash as "uuid" (vLLM's
// multimodal item id). The few inserted bytes are spliced between segments of the original
// messages value, so a megabyte image is not copied; a part that already has a uuid (the client's)
// is rewritten instead, replacing it.
func setMediaUUIDs(rc *request.Context, obj *body.Object) error {
	if len(rc.Media) == 0 {
		return nil
	}
	rawMsgs, msgs, err := chatMessages(obj)
	if err != nil || msgs == nil {
		return err
	}
	segs := make([][]byte, 0, 2*len(rc.Media)+1)
	last := 0
	for i := range rc.Media {
		m := &rc.Media[i]
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
			return setMediaUUIDsByRewrite(rc, obj)
		}
		end := off + len(part) - 1 // the part's closing brace
		insert := `,"uuid":`
		if p.Len() == 0 {
			insert = `"uuid":`
		}
		segs = append(segs, rawMsgs[last:end], append([]byte(insert), mustJSON(m.Hash)...))
		last = end
	}
	if last == 0 {
		return nil
	}
	obj.SetSegments("messages", append(segs, rawMsgs[last:])...)
	return nil
}

// setMediaUUIDsByRewrite is setMediaUUIDs for parts that already carry a uuid: they are decoded
// and re-assembled.
func setMediaUUIDsByRewrite(rc *request.Context, obj *body.Object) error {
	return editParts(obj, rc.Media, func(part *body.Object, m *request.MediaEntry) error {
		if m.Hash != "" {
			part.Set("uuid", mustJSON(m.Hash))
		}
		return nil
	})
}

// setMediaURLs writes each entry's URL (after inlining) back into its part.
func setMediaURLs(obj *body.Object, media []request.MediaEntry) error {
	return editParts(obj, media, func(part *body.Object, m *request.MediaEntry) error {
		k := kindOf(m.Kind)
		return editObject(part, k.field, func(inner *body.Object) error {
			inner.Set("url", mustJSON(m.URL))
			return nil
		})
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

// mediaPart returns the raw value of an entry's part member (e.g. the image_url object).
func mediaPart(msgs []json.RawMessage, m *request.MediaEntry) (json.RawMessage, error) {
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
	return raw, nil
}

var errMediaMissing = apierror.BadRequest("invalid_media", "media part not found in messages")

// editParts applies fn to messages[m.Message].content[m.Part] for each entry and writes the edited
// messages back into obj.
func editParts(obj *body.Object, media []request.MediaEntry, fn func(part *body.Object, m *request.MediaEntry) error) error {
	_, msgs, err := chatMessages(obj)
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
			return apierror.InvalidField("messages", "messages[%d] must be an object", mi)
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
	obj.Set("messages", json.RawMessage(body.AppendArray(nil, msgs)))
	return nil
}
