package simworker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// RenderedImage is one image found while rendering chat messages.
type RenderedImage struct {
	// Hash is the image's mm_hash (ImageHash of Bytes).
	Hash string
	// Offset is the index in the token ids of the first placeholder token.
	Offset int
	// Length is the number of placeholder tokens (ImageTokenCount of Bytes).
	Length int
	// Bytes is the image payload B (see ImageBytes).
	Bytes []byte
}

// ChatRendering is the deterministic tokenization of chat messages.
type ChatRendering struct {
	// TokenIDs is BOS, then for each message its role token and content.
	TokenIDs []int
	// Images lists the image parts in order of appearance.
	Images []RenderedImage
	// LastUserText is the text of the last user message (its text parts
	// joined by spaces); simworker echoes its words.
	LastUserText string
}

// chatMessage is the part of an OpenAI chat message the tokenizer reads.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// contentPart is one element of an array message content. Fields such as
// "uuid" are deliberately ignored.
type contentPart struct {
	Type     string          `json:"type"`
	Text     *string         `json:"text"`
	ImageURL json.RawMessage `json:"image_url"`
}

// RenderChat tokenizes the JSON array of OpenAI chat messages the way the
// worker's render service and prompt keys do: BOS, then for each message its
// role token (see RoleTokenID) followed by its content. String content and
// text parts are tokenized with TokenizeText; an image_url part becomes
// ImageTokenCount(B) ImageTokenID tokens, where B is ImageBytes(url).
func RenderChat(messages json.RawMessage) (*ChatRendering, error) {
	if len(bytes.TrimSpace(messages)) == 0 || bytes.Equal(bytes.TrimSpace(messages), []byte("null")) {
		return nil, fmt.Errorf("messages is required")
	}
	var msgs []chatMessage
	if err := json.Unmarshal(messages, &msgs); err != nil {
		return nil, fmt.Errorf("messages must be an array of messages: %v", err)
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("messages must not be empty")
	}
	out := &ChatRendering{TokenIDs: []int{BOSTokenID}}
	for i, m := range msgs {
		out.TokenIDs = append(out.TokenIDs, RoleTokenID(m.Role))
		text, err := out.appendContent(m.Content)
		if err != nil {
			return nil, fmt.Errorf("messages[%d].content: %v", i, err)
		}
		if m.Role == "user" {
			out.LastUserText = text
		}
	}
	return out, nil
}

// appendContent tokenizes one message content and returns its text.
func (c *ChatRendering) appendContent(content json.RawMessage) (string, error) {
	trimmed := bytes.TrimSpace(content)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return "", nil
	}
	switch trimmed[0] {
	case '"':
		var s string
		if err := json.Unmarshal(trimmed, &s); err != nil {
			return "", err
		}
		c.TokenIDs = append(c.TokenIDs, TokenizeText(s)...)
		return s, nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(trimmed, &parts); err != nil {
			return "", err
		}
		var texts []string
		for j, p := range parts {
			text, err := c.appendPart(p)
			if err != nil {
				return "", fmt.Errorf("part %d: %v", j, err)
			}
			if p.Type == "text" {
				texts = append(texts, text)
			}
		}
		return strings.Join(texts, " "), nil
	default:
		return "", fmt.Errorf("must be a string, an array of parts or null")
	}
}

// appendPart tokenizes one content part and returns its text, if any.
func (c *ChatRendering) appendPart(p contentPart) (string, error) {
	switch p.Type {
	case "text":
		if p.Text == nil {
			return "", fmt.Errorf("text part without text")
		}
		c.TokenIDs = append(c.TokenIDs, TokenizeText(*p.Text)...)
		return *p.Text, nil
	case "image_url":
		url, err := partImageURL(p.ImageURL)
		if err != nil {
			return "", err
		}
		b, err := ImageBytes(url)
		if err != nil {
			return "", err
		}
		img := RenderedImage{Hash: ImageHash(b), Offset: len(c.TokenIDs), Length: ImageTokenCount(b), Bytes: b}
		for range img.Length {
			c.TokenIDs = append(c.TokenIDs, ImageTokenID)
		}
		c.Images = append(c.Images, img)
		return "", nil
	default:
		return "", fmt.Errorf("unsupported content part type %q", p.Type)
	}
}

// partImageURL extracts the URL of an image_url part, which is either
// {"url": "..."} or, leniently, a bare string.
func partImageURL(raw json.RawMessage) (string, error) {
	var obj struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(raw, &obj); err == nil && obj.URL != "" {
		return obj.URL, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil && s != "" {
		return s, nil
	}
	return "", fmt.Errorf("image_url part without image_url.url")
}
