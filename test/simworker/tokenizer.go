package simworker

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
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

// FNV-1a (32-bit) parameters of WordTokenID.
const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

// WordTokenID returns the token id of one whitespace-free word:
// 100 + fnv32a(word) % 30000.
func WordTokenID(word string) int {
	h := uint32(fnvOffset32)
	for i := 0; i < len(word); i++ {
		h ^= uint32(word[i])
		h *= fnvPrime32
	}
	return wordTokenBase + int(h%wordTokenRange)
}

// TokenizeText splits text on whitespace and returns one token id per word,
// without BOS.
func TokenizeText(text string) []int {
	return appendTextTokens([]int{}, text)
}

// appendTextTokens appends the token ids of the words of text to ids.
func appendTextTokens(ids []int, text string) []int {
	for w := range strings.FieldsSeq(text) {
		ids = append(ids, WordTokenID(w))
	}
	return ids
}

// TokenizePrompt returns the token ids of a completions prompt: BOS followed
// by one token per word.
func TokenizePrompt(prompt string) []int {
	return appendTextTokens([]int{BOSTokenID}, prompt)
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
	var buf [4 << 10]byte
	for len(tokenIDs) > 0 {
		n := min(len(tokenIDs), len(buf)/4)
		for i, id := range tokenIDs[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], uint32(id))
		}
		_, _ = h.Write(buf[:4*n])
		tokenIDs = tokenIDs[n:]
	}
	return hex.EncodeToString(h.Sum(nil))
}
