package renderref_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// vocab maps ids back to text for mismatch reports, read straight from tokenizer.json so that a
// report does not depend on the tokenizer under test.
type vocab struct {
	tokens map[int]string
	added  map[int]bool
	bytes  map[rune]byte // byte-level BPE: the printable rune standing for each byte
}

func loadVocab(t *testing.T, dir string) vocab {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tj struct {
		Model struct {
			Vocab map[string]int `json:"vocab"`
		} `json:"model"`
		AddedTokens []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(data, &tj); err != nil {
		t.Fatalf("%s/tokenizer.json: %v", dir, err)
	}
	v := vocab{tokens: map[int]string{}, added: map[int]bool{}, bytes: byteLevelRunes()}
	for tok, id := range tj.Model.Vocab {
		v.tokens[id] = tok
	}
	for _, a := range tj.AddedTokens {
		v.tokens[a.ID], v.added[a.ID] = a.Content, true
	}
	return v
}

// decode returns the text of one id (bytes of a partial UTF-8 sequence stay as they are).
func (v vocab) decode(id int) string {
	tok, ok := v.tokens[id]
	if !ok || v.added[id] {
		return tok
	}
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		if b, ok := v.bytes[r]; ok {
			out = append(out, b)
		} else {
			out = append(out, string(r)...)
		}
	}
	return string(out)
}

// byteLevelRunes inverts GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
// the others for U+0100 onwards in byte order.
func byteLevelRunes() map[rune]byte {
	m := map[rune]byte{}
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae {
			m[rune(b)] = byte(b)
		} else {
			m[rune(256+n)] = byte(b)
			n++
		}
	}
	return m
}
