package simworker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// RenderedMedia is one media item (an image, audio or a video) found while rendering chat
// messages.
type RenderedMedia struct {
	// Modality is ModalityImage, ModalityAudio or ModalityVideo.
	Modality string
	// Hash is the item's mm_hash (MediaHash of Bytes).
	Hash string
	// Offset is the index in the token ids of the first placeholder token.
	Offset int
	// Length is the number of placeholder tokens (MediaTokenCount of Bytes).
	Length int
	// Bytes is the item's payload B (see ImageBytes; an input_audio's decoded data).
	Bytes []byte
}

// ChatRendering is the deterministic tokenization of chat messages.
type ChatRendering struct {
	// TokenIDs is BOS, then for each message its role token and content.
	TokenIDs []int
	// Images lists the image parts in order of appearance.
	Images []RenderedMedia
	// Media lists the media parts of every modality in order of appearance.
	Media []RenderedMedia
	// LastUserText is the text of the last user message (its text parts
	// joined by spaces); simworker echoes its words.
	LastUserText string
}

// errNoMessages reports a chat request without messages.
var errNoMessages = errors.New("messages is required")

// RenderChat tokenizes the JSON array of OpenAI chat messages the way the
// worker's render service and prompt keys do: BOS, then for each message its
// role token (see RoleTokenID) followed by its content. String content and
// text parts are tokenized with TokenizeText; a media part becomes
// MediaTokenCount(m, B) MediaTokenID(m) tokens, m being its modality: an
// image_url part ImageTokenCount(B) ImageTokenID tokens, where B is
// ImageBytes(url), an audio_url or video_url part likewise, an input_audio
// part's B its decoded data.
func RenderChat(messages json.RawMessage) (*ChatRendering, error) {
	messages = bytes.TrimSpace(messages)
	if absent(messages) {
		return nil, errNoMessages
	}
	if !validJSON(messages) {
		var v any
		return nil, fmt.Errorf("messages must be an array of messages: %w", json.Unmarshal(messages, &v))
	}
	r := renderer{detail: imageData}
	if err := r.render(messages); err != nil {
		return nil, err
	}
	// The texts share messages' memory: the caller's, which it may reuse.
	out := &ChatRendering{TokenIDs: r.ids, LastUserText: strings.Clone(strings.Join(r.lastUser, " "))}
	for _, im := range r.images {
		m := RenderedMedia{Modality: im.modality(), Hash: im.hash(), Offset: im.offset, Length: im.tokens(), Bytes: im.data}
		out.Media = append(out.Media, m)
		if m.Modality == ModalityImage {
			out.Images = append(out.Images, m)
		}
	}
	return out, nil
}

// renderer tokenizes chat messages (see RenderChat).
type renderer struct {
	detail   imageDetail // what to compute of each media item
	ids      []int
	images   []chatImage // the media items of every modality, in order
	lastUser []string    // the texts of the last user message
	// lastRole and lastTexts are the role and texts of the final message.
	lastRole  string
	lastTexts []string
}

// chatMessage is the part of an OpenAI chat message the tokenizer reads.
type chatMessage struct {
	role    string
	content []byte // raw
}

// contentPart is one element of an array message content. Members such as
// "uuid" are deliberately ignored.
type contentPart struct {
	typ  string
	text *string
	// media is the raw member of a media part's type (image_url, audio_url, video_url,
	// input_audio).
	media []byte
}

// render tokenizes messages, a validated JSON value.
func (r *renderer) render(messages []byte) error {
	if absent(messages) {
		return errNoMessages
	}
	if messages[0] != '[' {
		return errors.New("messages must be an array of messages")
	}
	msgs, err := decodeMessages(messages)
	if err != nil {
		return fmt.Errorf("messages must be an array of messages: %w", err)
	}
	if len(msgs) == 0 {
		return errors.New("messages must not be empty")
	}
	r.ids = append(make([]int, 0, 2*len(msgs)+estimateTokens(messages)), BOSTokenID)
	for i, m := range msgs {
		r.ids = append(r.ids, RoleTokenID(m.role))
		texts, err := r.content(m.content)
		if err != nil {
			return fmt.Errorf("messages[%d].content: %w", i, err)
		}
		if m.role == "user" {
			r.lastUser = texts
		}
		r.lastRole, r.lastTexts = m.role, texts
	}
	return nil
}

// decodeMessages decodes every message of a validated array (a null message
// is an empty one).
func decodeMessages(raw []byte) ([]chatMessage, error) {
	items, err := splitArray(raw)
	if err != nil {
		return nil, err
	}
	msgs := make([]chatMessage, len(items))
	var ferr error
	for i, it := range items {
		path := fmt.Sprintf("messages[%d]", i)
		m, err := nestedObject(it, path)
		if err != nil {
			return nil, err
		}
		f := fields{obj: m, path: path, err: &ferr}
		msgs[i] = chatMessage{role: f.str("role"), content: f.raw("content")}
		if ferr != nil {
			return nil, ferr
		}
	}
	return msgs, nil
}

// content tokenizes one message content and returns its texts.
func (r *renderer) content(raw []byte) ([]string, error) {
	switch {
	case absent(raw):
		return nil, nil
	case raw[0] == '"':
		s, err := jsonString(raw, "content")
		r.ids = appendTextTokens(r.ids, s)
		return []string{s}, err
	case raw[0] == '[':
		parts, err := decodeParts(raw)
		if err != nil {
			return nil, err
		}
		var texts []string
		for j, p := range parts {
			text, err := r.part(p)
			if err != nil {
				return nil, fmt.Errorf("part %d: %w", j, err)
			}
			if p.typ == "text" {
				texts = append(texts, text)
			}
		}
		return texts, nil
	}
	return nil, errors.New("must be a string, an array of parts or null")
}

// decodeParts decodes every part of a validated array content (a null part
// is an empty one).
func decodeParts(raw []byte) ([]contentPart, error) {
	items, err := splitArray(raw)
	if err != nil {
		return nil, err
	}
	parts := make([]contentPart, len(items))
	var ferr error
	for j, it := range items {
		path := fmt.Sprintf("content[%d]", j)
		o, err := nestedObject(it, path)
		if err != nil {
			return nil, err
		}
		f := fields{obj: o, path: path, err: &ferr}
		parts[j] = contentPart{typ: f.str("type")}
		if _, ok := mediaParts[parts[j].typ]; ok {
			parts[j].media = f.raw(parts[j].typ)
		}
		if text := f.raw("text"); text != nil {
			s := f.str("text")
			parts[j].text = &s
		}
		if ferr != nil {
			return nil, ferr
		}
	}
	return parts, nil
}

// part tokenizes one content part and returns its text, if any.
func (r *renderer) part(p contentPart) (string, error) {
	switch p.typ {
	case "text":
		if p.text == nil {
			return "", errors.New("text part without text")
		}
		r.ids = appendTextTokens(r.ids, *p.text)
		return *p.text, nil
	case "image_url", "audio_url", "video_url", "input_audio":
		m := mediaParts[p.typ]
		var im chatImage
		if p.typ == "input_audio" {
			data, err := partAudioData(p.media)
			if err != nil {
				return "", err
			}
			if im, err = loadBase64(m, data, r.detail); err != nil {
				return "", err
			}
		} else {
			url, err := partURL(p.media, p.typ)
			if err != nil {
				return "", err
			}
			if im, err = loadMedia(m, url, r.detail); err != nil {
				return "", err
			}
		}
		im.offset = len(r.ids)
		for range im.tokens() {
			r.ids = append(r.ids, MediaTokenID(m))
		}
		r.images = append(r.images, im)
		return "", nil
	}
	return "", fmt.Errorf("unsupported content part type %q", p.typ)
}

// partURL extracts the URL of an image_url, audio_url or video_url part (typ), which is either
// {"url": "..."} or, leniently, a bare string.
func partURL(raw []byte, typ string) (string, error) {
	var url string
	var err error
	switch {
	case absent(raw):
	case raw[0] == '{':
		var o *object
		if o, err = splitObject(raw); err == nil {
			url, err = jsonString(member(o, "url"), "url")
		}
	case raw[0] == '"':
		url, err = jsonString(raw, typ)
	}
	if err != nil || url == "" {
		return "", fmt.Errorf("%s part without %s.url", typ, typ)
	}
	return url, nil
}

// partAudioData extracts the base64 data of an input_audio part, {"data": "...", "format": ...}
// (vLLM reads the data by its content, whatever the format says).
func partAudioData(raw []byte) (string, error) {
	var data string
	var err error
	if !absent(raw) && raw[0] == '{' {
		var o *object
		if o, err = splitObject(raw); err == nil {
			data, err = jsonString(member(o, "data"), "data")
		}
	}
	if err != nil || data == "" {
		return "", errors.New("input_audio part without input_audio.data")
	}
	return data, nil
}
