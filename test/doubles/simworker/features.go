package simworker

import (
	"fmt"
	"slices"
)

// mmFeatures is the part of vLLM's MultiModalFeatures (render output, generate input, a chat
// leg's tokens.features) a Worker reads: the items of each modality (image, audio, video).
type mmFeatures struct {
	mods map[string]*mmItems
}

// mmItems are one modality's items of a features object, as parallel lists.
type mmItems struct {
	hashes   []string      // mm_hashes.<m>
	places   []placeholder // mm_placeholders.<m>; -1 for an offset or length it lacks
	kwargs   []*string     // kwargs_data.<m>; nil items have none
	metadata []*string     // mm_metadata.<m> (vllm-project/vllm#54659); nil items have none
	meta     []*mediaMeta  // metadata decoded (checkMetadata)
}

// placeholder is one item's token range.
type placeholder struct{ offset, length int }

// of returns modality m's items (empty, never nil).
func (f *mmFeatures) of(m string) *mmItems {
	if f == nil || f.mods[m] == nil {
		return &mmItems{}
	}
	return f.mods[m]
}

// item returns modality m's items, created when absent.
func (f *mmFeatures) item(m string) *mmItems {
	if f.mods == nil {
		f.mods = map[string]*mmItems{}
	}
	if f.mods[m] == nil {
		f.mods[m] = &mmItems{}
	}
	return f.mods[m]
}

// modalities returns the modalities with items, sorted.
func (f *mmFeatures) modalities() []string {
	if f == nil {
		return nil
	}
	var out []string
	for m, it := range f.mods {
		if len(it.hashes) > 0 || len(it.metadata) > 0 || len(it.kwargs) > 0 || len(it.places) > 0 {
			out = append(out, m)
		}
	}
	slices.Sort(out)
	return out
}

// metadataOnly reports whether an item of the features carries mm_metadata but no kwargs_data:
// vLLM then needs its encoder output from ec_transfer_params.
func (f *mmFeatures) metadataOnly() bool {
	for _, m := range f.modalities() {
		it := f.of(m)
		for i, md := range it.metadata {
			if md != nil && (i >= len(it.kwargs) || it.kwargs[i] == nil) {
				return true
			}
		}
	}
	return false
}

// checkMetadata enforces vLLM's rule for mm_metadata on the generate and completions formats:
// metadata-only items need ec_transfer_params (the 400 and its wording are vLLM's). Each item's
// metadata must also be the one the render service produced for its mm_hash and placeholder
// (MediaMetadata), and as long as its modality's mm_hashes.
func (in *inference) checkMetadata() *apiError {
	f := in.features
	for _, m := range f.modalities() {
		it := f.of(m)
		if it.metadata == nil {
			continue
		}
		if len(it.metadata) != len(it.hashes) {
			return badRequest("features.mm_metadata.%s must have one item per mm_hash (%d hashes, %d items)", m, len(it.hashes), len(it.metadata))
		}
		it.meta = make([]*mediaMeta, len(it.metadata))
		for i, md := range it.metadata {
			if md == nil {
				continue
			}
			length := -1
			if i < len(it.places) {
				length = it.places[i].length
			}
			meta, err := parseMediaMetadata(m, *md, it.hashes[i], length)
			if err != nil {
				return badRequest("features.mm_metadata.%s[%d] %v", m, i, err)
			}
			it.meta[i] = meta
		}
	}
	if in.ec == nil && f.metadataOnly() {
		return badRequest("metadata-only multimodal items require ec_transfer_params")
	}
	return nil
}

// metadataFor returns the decoded mm_metadata of the item of mm_hash h and its modality, nil when
// it has none (or checkMetadata did not run: chat).
func (f *mmFeatures) metadataFor(h string) (*mediaMeta, string) {
	for _, m := range f.modalities() {
		it := f.of(m)
		for i, md := range it.meta {
			if md != nil && it.hashes[i] == h {
				return md, m
			}
		}
	}
	return nil, ""
}

// hashes returns the mm_hashes of every modality, modality by modality (sorted).
func (f *mmFeatures) hashes() []string {
	var out []string
	for _, m := range f.modalities() {
		out = append(out, f.of(m).hashes...)
	}
	return out
}

// needEncoded returns the mm_hashes of the items without kwargs_data, modality by modality: the
// worker encodes items that carry their preprocessed inputs itself, as vLLM does for tokens-in
// requests; the others (metadata-only items among them) need encoder outputs.
func (f *mmFeatures) needEncoded() []string {
	var out []string
	for _, m := range f.modalities() {
		it := f.of(m)
		for i, h := range it.hashes {
			if i < len(it.kwargs) && it.kwargs[i] != nil {
				continue
			}
			out = append(out, h)
		}
	}
	return out
}

// parseFeatures reads a features object (nil when it is absent).
func parseFeatures(f fields) *mmFeatures {
	if f.obj == nil {
		return nil
	}
	placeholderOf := func(raw []byte, path string) (placeholder, error) {
		var err error
		o, oerr := nestedObject(raw, path)
		p := fields{obj: o, path: path, err: &err}
		p.keep(oerr)
		ph := placeholder{offset: -1, length: -1}
		if off := p.integer("offset"); off != nil {
			ph.offset = *off
		}
		if length := p.integer("length"); length != nil {
			ph.length = *length
		}
		return ph, err
	}
	optString := func(raw []byte, path string) (*string, error) {
		if absent(raw) {
			return nil, nil
		}
		s, err := jsonString(raw, path)
		return &s, err
	}
	feats := &mmFeatures{}
	for m, v := range modalityItems(f, "mm_hashes", jsonString) {
		feats.item(m).hashes = v
	}
	for m, v := range modalityItems(f, "mm_placeholders", placeholderOf) {
		feats.item(m).places = v
	}
	for m, v := range modalityItems(f, "kwargs_data", optString) {
		feats.item(m).kwargs = v
	}
	for m, v := range modalityItems(f, "mm_metadata", optString) {
		feats.item(m).metadata = v
	}
	return feats
}

// modalityItems reads member name of a features object, a map from modality to a list of items
// each decoded by item, and returns the lists by modality.
func modalityItems[T any](f fields, name string, item func(raw []byte, path string) (T, error)) map[string][]T {
	m := f.object(name)
	if m.obj == nil {
		return nil
	}
	out := map[string][]T{}
	for _, mod := range m.obj.Fields() {
		path := m.at(mod.Key)
		items, err := nestedArray(mod.Value, path)
		m.keep(err)
		list := make([]T, len(items))
		for i, it := range items {
			v, err := item(it, fmt.Sprintf("%s[%d]", path, i))
			m.keep(err)
			list[i] = v
		}
		out[mod.Key] = list
	}
	return out
}

// checkChatFeatures checks the tokens.features of a chat leg against its messages, as vLLM would
// fail to line them up: per modality, one mm_hash and one placeholder per media part of it in
// the messages (in document order), each placeholder as long as its part's token count and
// covering that modality's placeholder tokens of the prompt. A leg without features (text only,
// or no render) is not checked.
func (in *inference) checkChatFeatures() *apiError {
	f := in.features
	if f == nil {
		return nil
	}
	parts := map[string][]chatImage{}
	for _, im := range in.chatImages {
		parts[im.modality()] = append(parts[im.modality()], im)
	}
	mods := f.modalities()
	for m := range parts {
		if !slices.Contains(mods, m) {
			mods = append(mods, m)
		}
	}
	slices.Sort(mods)
	for _, m := range mods {
		it, want := f.of(m), parts[m]
		if len(it.hashes) != len(want) || len(it.places) != len(want) {
			return badRequest("tokens.features.mm_hashes.%s has %d items and mm_placeholders.%s %d, the messages have %d %s parts",
				m, len(it.hashes), m, len(it.places), len(want), m)
		}
		for i, ph := range it.places {
			n := want[i].tokens()
			if ph.length != n {
				return badRequest("tokens.features.mm_placeholders.%s[%d] has length %d, the %s part has %d tokens", m, i, ph.length, m, n)
			}
			if ph.offset < 0 || ph.offset+ph.length > len(in.promptIDs) {
				return badRequest("tokens.features.mm_placeholders.%s[%d] {offset %d, length %d} lies outside the %d prompt tokens", m, i, ph.offset, ph.length, len(in.promptIDs))
			}
			for k, id := range in.promptIDs[ph.offset : ph.offset+ph.length] {
				if id != MediaTokenID(m) {
					return badRequest("tokens.features.mm_placeholders.%s[%d] covers token %d (id %d), not the %s placeholder %d", m, i, ph.offset+k, id, m, MediaTokenID(m))
				}
			}
		}
	}
	return nil
}
