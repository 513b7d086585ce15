package simworker

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"unicode"
	"unicode/utf8"
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
	// AudioTokenID is the placeholder token repeated for each audio item (audio_url, input_audio).
	AudioTokenID = 32001
	// VideoTokenID is the placeholder token repeated for each video.
	VideoTokenID = 32002
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
		h = (h ^ uint32(word[i])) * fnvPrime32
	}
	return wordToken(h)
}

// wordToken returns the token id of a word whose FNV-1a hash is h.
func wordToken(h uint32) int {
	return wordTokenBase + int(h%wordTokenRange)
}

// TokenizeText splits text on whitespace and returns one token id per word,
// without BOS.
func TokenizeText(text string) []int {
	return appendTextTokens([]int{}, text)
}

// appendTextTokens appends the token ids of the words of text to ids. It
// splits text as strings.Fields does, hashing each word as it goes.
func appendTextTokens(ids []int, text string) []int {
	h, inWord := uint32(fnvOffset32), false
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c < utf8.RuneSelf && !asciiSpace[c] {
			h, inWord = (h^uint32(c))*fnvPrime32, true
			continue
		}
		space := c < utf8.RuneSelf
		if !space {
			r, size := utf8.DecodeRuneInString(text[i:])
			if space = unicode.IsSpace(r); !space {
				for _, b := range []byte(text[i : i+size]) {
					h = (h ^ uint32(b)) * fnvPrime32
				}
				inWord = true
			}
			i += size - 1
		}
		if space && inWord {
			ids = append(ids, wordToken(h))
			h, inWord = fnvOffset32, false
		}
	}
	if inWord {
		ids = append(ids, wordToken(h))
	}
	return ids
}

// asciiSpace marks the ASCII bytes unicode.IsSpace reports.
var asciiSpace = [256]bool{'\t': true, '\n': true, '\v': true, '\f': true, '\r': true, ' ': true}

// TokenizePrompt returns the token ids of a completions prompt: BOS followed
// by one token per word.
func TokenizePrompt(prompt string) []int {
	ids := make([]int, 1, 1+estimateTokens(bytesOf(prompt)))
	ids[0] = BOSTokenID
	return appendTextTokens(ids, prompt)
}

// estimateTokens guesses how many tokens text (or JSON holding it) makes:
// one per space, so that prose needs no regrowth of the token slice. Growing
// a slice of tens of thousands of ids costs as much as tokenizing them.
func estimateTokens(text []byte) int {
	return bytes.Count(text, []byte{' '}) + 1
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

// SaltedKey is the prompt key of a request with vLLM's cache_salt: key itself without one,
// otherwise a key of its own, so that the salt partitions the prefix cache and the KV
// handles (a decode whose salt differs from its prefill's fails the transfer check).
func SaltedKey(key, salt string) string {
	if salt == "" {
		return key
	}
	h := sha256.New()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(salt))
	return hex.EncodeToString(h.Sum(nil))
}
