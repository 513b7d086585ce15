package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/media"
	"github.com/epd-dev/coordinator/dataplane/state/body"
	"github.com/epd-dev/coordinator/dataplane/state/request"
)

// Features is the features object of the tokens-in format, a client's or a render answer's (the
// legs' own are written by featuresJSON).
// MMMetadata (vllm-project/vllm#54659) is optional: null or absent when no item has metadata,
// else an object of per-modality lists parallel to mm_hashes; it is kept raw so that a bad shape
// gets an error naming it.
type Features struct {
	MMHashes       map[string]json.RawMessage `json:"mm_hashes"`
	MMPlaceholders map[string]json.RawMessage `json:"mm_placeholders"`
	KwargsData     map[string]json.RawMessage `json:"kwargs_data"`
	MMMetadata     json.RawMessage            `json:"mm_metadata"`
}

// metadata returns mm_metadata by modality (nil when null or absent). Every modality must have
// mm_hashes; the lengths are checked by entries.
func (f *Features) metadata() (map[string]json.RawMessage, error) {
	switch body.KindOf(f.MMMetadata) {
	case body.KindNone, body.KindNull:
		return nil, nil
	case body.KindObject:
	default:
		return nil, errors.New("mm_metadata must be an object of per-modality lists, or null")
	}
	var meta map[string]json.RawMessage
	if err := json.Unmarshal(f.MMMetadata, &meta); err != nil {
		return nil, fmt.Errorf("mm_metadata must be an object of per-modality lists: %w", err)
	}
	for _, m := range slices.Sorted(maps.Keys(meta)) {
		if _, ok := f.MMHashes[m]; !ok {
			return nil, fmt.Errorf("mm_metadata.%s names a modality without mm_hashes", m)
		}
	}
	return meta, nil
}

// Entries validates the features and returns one media entry per item, modality by modality.
// Errors name the offending path below features.
func (f *Features) Entries() ([]request.MediaEntry, error) {
	meta, err := f.metadata()
	if err != nil {
		return nil, err
	}
	mods := make([]string, 0, len(f.MMHashes))
	for m := range f.MMHashes {
		mods = append(mods, m)
	}
	sort.Strings(mods)
	var out []request.MediaEntry
	for _, m := range mods {
		var hashes []json.RawMessage
		if err := json.Unmarshal(f.MMHashes[m], &hashes); err != nil && body.KindOf(f.MMHashes[m]) != body.KindNull {
			return nil, fmt.Errorf("mm_hashes.%s must be an array", m)
		}
		var metas []json.RawMessage
		if raw, ok := meta[m]; ok && body.KindOf(raw) != body.KindNull {
			if err := json.Unmarshal(raw, &metas); err != nil || len(metas) != len(hashes) {
				return nil, fmt.Errorf("mm_metadata.%s must be an array with one item per hash (%d)", m, len(hashes))
			}
		}
		if len(hashes) == 0 {
			continue
		}
		var phs []json.RawMessage
		if err := json.Unmarshal(f.MMPlaceholders[m], &phs); err != nil || len(phs) != len(hashes) {
			return nil, fmt.Errorf("mm_placeholders.%s must be an array with one placeholder per hash (%d)", m, len(hashes))
		}
		var kwargs []json.RawMessage
		if raw, ok := f.KwargsData[m]; ok && body.KindOf(raw) != body.KindNull {
			if err := json.Unmarshal(raw, &kwargs); err != nil || len(kwargs) != len(hashes) {
				return nil, fmt.Errorf("kwargs_data.%s must be an array with one item per hash (%d)", m, len(hashes))
			}
		}
		for i, rawHash := range hashes {
			var h string
			if err := json.Unmarshal(rawHash, &h); err != nil || h == "" {
				return nil, fmt.Errorf("mm_hashes.%s[%d] must be a non-empty string", m, i)
			}
			var ph struct {
				Offset json.Number `json:"offset"`
				Length json.Number `json:"length"`
			}
			if err := json.Unmarshal(phs[i], &ph); err != nil {
				return nil, fmt.Errorf("mm_placeholders.%s[%d] must be {offset, length}", m, i)
			}
			off, err1 := body.ParseInt([]byte(ph.Offset))
			length, err2 := body.ParseInt([]byte(ph.Length))
			if err1 != nil || err2 != nil || off < 0 || length < 0 {
				return nil, fmt.Errorf("mm_placeholders.%s[%d] offset and length must be non-negative integers", m, i)
			}
			e := request.MediaEntry{Message: -1, Part: -1, Kind: media.KindOf(m), Hash: h, Placeholder: request.Placeholder{Offset: int(off), Length: int(length)}}
			if kwargs != nil {
				if k := body.KindOf(kwargs[i]); k != body.KindString && k != body.KindNull {
					return nil, fmt.Errorf("kwargs_data.%s[%d] must be a string or null", m, i)
				}
				if body.KindOf(kwargs[i]) == body.KindString {
					e.Kwargs = kwargs[i]
				}
			}
			if metas != nil {
				switch body.KindOf(metas[i]) {
				case body.KindString:
					e.Metadata = metas[i]
				case body.KindNull:
				default:
					return nil, fmt.Errorf("mm_metadata.%s[%d] must be a string or null", m, i)
				}
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// maxTokenID bounds a token id: no vocabulary is larger (ids past a loaded one's are refused by
// the render step).
const maxTokenID = 1 << 31

// TokenIDs decodes an array of token ids: JSON integers written as integers (no fraction, no
// exponent, no sign), each below 2³¹, in one pass over raw with no value per item.
func TokenIDs(raw json.RawMessage) ([]int, error) {
	ids, _, err := ParseTokenIDs(raw, maxTokenID)
	return ids, err
}

// MaxAnswerTokenID bounds an id a render service answers with: any integer JSON carries exactly
// (the vLLM simulator's are 32-bit hashes, past a client's 2³¹).
const MaxAnswerTokenID = 1 << 53

// ParseTokenIDs is TokenIDs with ids below limit (at most MaxAnswerTokenID), and reports whether
// raw is written as body.AppendInts writes the ids (no space anywhere): then raw can be sent on
// as their JSON, not written again.
func ParseTokenIDs(raw json.RawMessage, limit int) (ids []int, canonical bool, err error) {
	i, n := 0, len(raw)
	spaced := false
	space := func() {
		for i < n && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
			spaced = true
		}
	}
	space()
	if i == n || raw[i] != '[' {
		return nil, false, errors.New("must be an array of token ids")
	}
	i++
	ids = make([]int, 0, len(raw)/4)
	for k := 0; ; k++ {
		space()
		if k == 0 && i < n && raw[i] == ']' {
			return ids, !spaced && i+1 == n, nil
		}
		start, id := i, 0
		for i < n && raw[i] >= '0' && raw[i] <= '9' && id < limit {
			id = id*10 + int(raw[i]-'0')
			i++
		}
		end := i
		for end < n && !strings.ContainsRune(" \t\n\r,]", rune(raw[end])) {
			end++
		}
		if i == start || i != end || id >= limit || raw[start] == '0' && i-start > 1 {
			return nil, false, fmt.Errorf("must hold non-negative integers below %d, written as integers (item %d is %.20s)", limit, k, raw[start:end])
		}
		ids = append(ids, id)
		space()
		if i < n && raw[i] == ']' {
			return ids, !spaced && i+1 == n, nil
		}
		if i == n || raw[i] != ',' {
			return nil, false, errors.New("must be an array of token ids")
		}
		i++
	}
}
