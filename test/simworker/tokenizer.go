package simworker

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/fnv"
	"strings"
)

// Token ids with a fixed meaning in the deterministic tokenizer.
const (
	// BOSTokenID starts every rendered prompt.
	BOSTokenID = 1
	// SystemTokenID precedes the content of a system message.
	SystemTokenID = 3
	// UserTokenID precedes the content of a user message.
	UserTokenID = 4
	// AssistantTokenID precedes the content of an assistant message.
	AssistantTokenID = 5
	// OtherRoleTokenID precedes the content of a message of any other role.
	OtherRoleTokenID = 6
	// ImageTokenID is the placeholder token repeated for each image.
	ImageTokenID = 32000
)

// wordTokenBase and wordTokenRange map words into [100, 30100).
const (
	wordTokenBase  = 100
	wordTokenRange = 30000
)

// kwargsBlobBase is the fixed part of the size of an image's kwargs blob.
const kwargsBlobBase = 4096

// WordTokenID returns the token id of one whitespace-free word:
// 100 + fnv32a(word) % 30000.
func WordTokenID(word string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(word))
	return wordTokenBase + int(h.Sum32()%wordTokenRange)
}

// TokenizeText splits text on whitespace and returns one token id per word,
// without BOS.
func TokenizeText(text string) []int {
	words := strings.Fields(text)
	ids := make([]int, len(words))
	for i, w := range words {
		ids[i] = WordTokenID(w)
	}
	return ids
}

// TokenizePrompt returns the token ids of a completions prompt: BOS followed
// by one token per word.
func TokenizePrompt(prompt string) []int {
	return append([]int{BOSTokenID}, TokenizeText(prompt)...)
}

// RoleTokenID returns the token id that precedes a chat message of role.
func RoleTokenID(role string) int {
	switch role {
	case "system":
		return SystemTokenID
	case "user":
		return UserTokenID
	case "assistant":
		return AssistantTokenID
	default:
		return OtherRoleTokenID
	}
}

// PromptKey identifies a prompt in the prefix cache and in shared-storage
// file names: the hex SHA-256 of the token ids, each encoded as a 4-byte
// little-endian unsigned integer.
func PromptKey(tokenIDs []int) string {
	h := sha256.New()
	var buf [4]byte
	for _, id := range tokenIDs {
		binary.LittleEndian.PutUint32(buf[:], uint32(id))
		_, _ = h.Write(buf[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// ImageBytes returns the bytes B that stand for the image at url: the decoded
// payload of a "data:<mime>;base64,<b64>" URL, or the URL's own bytes for any
// other URL. It fails only on a base64 data URL with an invalid payload.
func ImageBytes(url string) ([]byte, error) {
	if !strings.HasPrefix(url, "data:") {
		return []byte(url), nil
	}
	meta, payload, ok := strings.Cut(url[len("data:"):], ",")
	if !ok || !strings.HasSuffix(meta, ";base64") {
		return []byte(url), nil
	}
	b, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		if b2, err2 := base64.RawStdEncoding.DecodeString(payload); err2 == nil {
			return b2, nil
		}
		return nil, errors.New("invalid base64 payload in image data URL")
	}
	return b, nil
}

// ImageTokenCount returns the number of placeholder tokens of an image whose
// bytes are b: 4 + len(b) % 61.
func ImageTokenCount(b []byte) int {
	return 4 + len(b)%61
}

// ImageHash returns the mm_hash of an image whose bytes are b: hex SHA-256.
func ImageHash(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ImageKwargsSize returns the size in bytes of ImageKwargsBlob for an image of
// n bytes: 4096 + 3*n. It is also the size_bytes of the image's EC descriptor.
func ImageKwargsSize(n int) int {
	return kwargsBlobBase + 3*n
}

// ImageKwargsBlob returns the deterministic stand-in for the processed
// multimodal kwargs (pixel values) of an image whose bytes are b. Its size is
// ImageKwargsSize(len(b)).
func ImageKwargsBlob(b []byte) []byte {
	seed := sha256.Sum256(b)
	out := make([]byte, ImageKwargsSize(len(b)))
	for i := range out {
		out[i] = seed[i%len(seed)] ^ byte(i*131>>3)
	}
	return out
}
