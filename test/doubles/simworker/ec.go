package simworker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
)

// encodeItem is one media item (image, audio or video) an encode leg computes.
type encodeItem struct {
	hash   string
	size   int           // of the simulated encoder output
	output func() []byte // the simulated encoder output, built when it is stored
}

// serveEncode serves a request on an encode worker.
func (w *Worker) serveEncode(rw http.ResponseWriter, r *http.Request, in *inference) {
	items, err := encodeItems(in)
	if err != nil {
		writeAPIError(rw, err)
		return
	}
	if err := in.requireSingleToken("encode"); err != nil {
		writeAPIError(rw, err)
		return
	}
	var params map[string]ECDescriptor
	switch w.cfg.ECConnector {
	case ECSharedStorage:
		for _, it := range items {
			if err := writeFileAtomic(filepath.Join(w.cfg.ECDir, it.hash), it.output()); err != nil {
				writeError(rw, http.StatusInternalServerError, "EC store failed: "+err.Error())
				return
			}
		}
	default:
		host, port := w.advertised(r)
		params = make(map[string]ECDescriptor, len(items))
		for _, it := range items {
			d := ECDescriptor{
				PeerHost:  host,
				PeerPort:  port,
				SizeBytes: it.size,
				NixlAgentMetadataB64: base64.StdEncoding.EncodeToString(
					fmt.Appendf(nil, "nixl-agent/%s/%s/%d", w.engineID, it.hash, it.size)),
			}
			hash := strings.Clone(it.hash) // it.hash shares the request body
			w.ecDescs.put(hash, d)
			params[hash] = d
		}
	}
	w.respond(rw, r, in, nil, params)
}

// encodeItems validates the shape of an encode leg and returns its items. A chat leg carries one
// media part of any modality and, in its tokens.features, that modality's one mm_hash, which
// must be the part's (MediaHash of its bytes); a generate leg the kwargs_data of every item.
func encodeItems(in *inference) ([]encodeItem, *apiError) {
	hashes := in.features.hashes()
	switch in.kind {
	case kindChat:
		if len(in.chatImages) != 1 {
			return nil, badRequest("encode request must contain exactly one media part (image_url, audio_url, input_audio or video_url), got %d", len(in.chatImages))
		}
		item := in.chatImages[0]
		m := item.modality()
		if own := in.features.of(m).hashes; len(own) != 1 || len(hashes) != 1 {
			return nil, badRequest("encode request requires tokens.features.mm_hashes.%s with exactly one mm_hash (and no other modality), got %d of %d", m, len(own), len(hashes))
		}
		if !validHash(hashes[0]) {
			return nil, badRequest("invalid mm_hash %q", hashes[0])
		}
		if hashes[0] != item.hash() {
			return nil, badRequest("mm_hash %s is not the %s part's (its bytes hash to %s)", hashes[0], m, item.hash())
		}
		return []encodeItem{{
			hash:   hashes[0],
			size:   ImageKwargsSize(item.size),
			output: func() []byte { return kwargsBlob(item.sum, item.size) },
		}}, nil
	case kindGenerate:
		if len(hashes) == 0 {
			return nil, badRequest("encode request requires features.mm_hashes")
		}
		var items []encodeItem
		for _, m := range in.features.modalities() {
			f := in.features.of(m)
			if len(f.kwargs) != len(f.hashes) {
				return nil, badRequest("encode request requires features.kwargs_data.%s for every mm_hash (%d hashes, %d items)", m, len(f.hashes), len(f.kwargs))
			}
			for i, h := range f.hashes {
				if !validHash(h) {
					return nil, badRequest("invalid mm_hash %q", h)
				}
				if f.kwargs[i] == nil {
					return nil, badRequest("features.kwargs_data.%s[%d] is null", m, i)
				}
				data, err := base64.StdEncoding.DecodeString(*f.kwargs[i])
				if err != nil {
					data = []byte(*f.kwargs[i])
				}
				items = append(items, encodeItem{hash: h, size: len(data), output: func() []byte { return data }})
			}
		}
		return items, nil
	default:
		return nil, badRequest("encode worker serves only %s and %s", PathChatCompletions, PathGenerate)
	}
}

// verifyEC checks that the encoder outputs of every media item (of any modality) of the request
// are available. Strict checks (prefill legs) require them; lenient checks (local computation)
// verify ec_transfer_params only when the request carries them, since the worker could encode
// the items itself. Items that carry their preprocessed inputs (kwargs_data) are encoded inline
// by this worker, as vLLM does for tokens-in requests; only the others (metadata-only items among
// them) need encoder outputs.
func (w *Worker) verifyEC(ctx context.Context, in *inference, strict bool) *apiError {
	hashes := in.features.needEncoded()
	if len(hashes) == 0 {
		return nil
	}
	var err error
	switch w.cfg.ECConnector {
	case ECSharedStorage:
		if strict {
			err = verifyECFiles(w.cfg.ECDir, hashes)
		}
	default:
		if strict || in.ec != nil {
			err = w.verifyECNixl(ctx, in, hashes)
		}
	}
	if err != nil {
		return badRequest("EC transfer failed: %v", err)
	}
	return nil
}

// verifyECFiles requires dir/<hash> for every hash.
func verifyECFiles(dir string, hashes []string) error {
	for _, h := range hashes {
		if !validHash(h) {
			return fmt.Errorf("invalid mm_hash %q", h)
		}
		if _, err := os.Stat(filepath.Join(dir, h)); err != nil {
			return fmt.Errorf("no encoder cache file for mm_hash %s in %s", h, dir)
		}
	}
	return nil
}

// verifyECNixl requires a descriptor for every hash that matches the one the
// encode worker serves.
func (w *Worker) verifyECNixl(ctx context.Context, in *inference, hashes []string) error {
	for _, h := range hashes {
		raw, ok := in.ec[h]
		if !ok || isNull(raw) {
			return fmt.Errorf("%s has no descriptor for mm_hash %s", in.ecName, h)
		}
		var d ECDescriptor
		if err := json.Unmarshal(raw, &d); err != nil {
			return fmt.Errorf("%s[%s] is malformed: %w", in.ecName, h, err)
		}
		if d.PeerHost == "" || d.PeerPort < 1 || d.PeerPort > 65535 {
			return fmt.Errorf("%s[%s] needs peer_host and a valid peer_port", in.ecName, h)
		}
		var peer ECDescriptor
		decode := func(b []byte) error { return json.Unmarshal(b, &peer) }
		if err := w.lookup(ctx, d.PeerHost, d.PeerPort, "ec", h, decode); err != nil {
			if errors.Is(err, errNotFound) {
				return fmt.Errorf("mm_hash %s unknown to %s:%d", h, d.PeerHost, d.PeerPort)
			}
			return err
		}
		if d.SizeBytes != peer.SizeBytes || d.NixlAgentMetadataB64 != peer.NixlAgentMetadataB64 {
			return fmt.Errorf("mm_hash %s: descriptor mismatch: request has size_bytes=%d metadata=%q, encode worker has size_bytes=%d metadata=%q",
				h, d.SizeBytes, d.NixlAgentMetadataB64, peer.SizeBytes, peer.NixlAgentMetadataB64)
		}
		// The item's mm_metadata, when it has one, must describe the item the encoder encoded.
		if m, mod := in.features.metadataFor(h); m != nil && ImageKwargsSize(m.Size) != peer.SizeBytes {
			return fmt.Errorf("mm_hash %s: mm_metadata describes a %d-byte %s, the encoder output has size_bytes=%d (want %d)",
				h, m.Size, mod, peer.SizeBytes, ImageKwargsSize(m.Size))
		}
	}
	return nil
}
