package steps

import (
	"encoding/json"

	"github.com/epd-dev/coordinator/dataplane/apierror"
	"github.com/epd-dev/coordinator/dataplane/body"
	"github.com/epd-dev/coordinator/dataplane/pipeline"
)

// setMediaUUIDs gives each rendered media part of a chat body its mm_hash as "uuid" (vLLM's
// multimodal item id), replacing any uuid the client sent. Only the messages holding media are
// re-assembled; every other value is copied through raw.
func setMediaUUIDs(rc *pipeline.RequestContext, obj *body.Object) error {
	if len(rc.Media) == 0 {
		return nil
	}
	return editParts(obj, rc.Media, func(part *body.Object, m *pipeline.MediaEntry) {
		if m.Hash != "" {
			part.Set("uuid", mustJSON(m.Hash))
		}
	})
}

// editParts applies fn to messages[m.Message].content[m.Part] for each entry and writes the edited
// messages back into obj.
func editParts(obj *body.Object, media []pipeline.MediaEntry, fn func(part *body.Object, m *pipeline.MediaEntry)) error {
	rawMsgs, ok := obj.Get("messages")
	if !ok {
		return nil
	}
	msgs, err := body.Array(rawMsgs)
	if err != nil {
		return apierror.InvalidField("messages", "messages must be an array")
	}
	byMsg := map[int][]int{}
	for i := range media {
		if media[i].Message >= 0 && media[i].Message < len(msgs) {
			byMsg[media[i].Message] = append(byMsg[media[i].Message], i)
		}
	}
	for mi, entries := range byMsg {
		msg, err := body.Parse(msgs[mi])
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
			part, err := body.Parse(parts[m.Part])
			if err != nil {
				continue
			}
			fn(part, m)
			parts[m.Part] = part.Bytes()
		}
		msg.Set("content", body.AppendArray(nil, parts))
		msgs[mi] = msg.Bytes()
	}
	obj.Set("messages", json.RawMessage(body.AppendArray(nil, msgs)))
	return nil
}
