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

// encodeItem is one image an encode leg computes.
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

// encodeItems validates the shape of an encode leg and returns its images.
func encodeItems(in *inference) ([]encodeItem, *apiError) {
	hashes := in.features.hashes()
	switch in.kind {
	case kindChat:
		if len(in.chatImages) != 1 {
			return nil, badRequest("encode request must contain exactly one image part, got %d", len(in.chatImages))
		}
		if len(hashes) != 1 {
			return nil, badRequest("encode request requires tokens.features.mm_hashes.image with exactly one mm_hash, got %d", len(hashes))
		}
		if !validHash(hashes[0]) {
			return nil, badRequest("invalid mm_hash %q", hashes[0])
		}
		img := in.chatImages[0]
		return []encodeItem{{
			hash:   hashes[0],
			size:   ImageKwargsSize(img.size),
			output: func() []byte { return kwargsBlob(img.sum, img.size) },
		}}, nil
	case kindGenerate:
		if len(hashes) == 0 {
			return nil, badRequest("encode request requires features.mm_hashes.image")
		}
		kwargs := in.features.imageKwargs
		if len(kwargs) != len(hashes) {
			return nil, badRequest("encode request requires features.kwargs_data.image for every mm_hash (%d hashes, %d items)", len(hashes), len(kwargs))
		}
		items := make([]encodeItem, len(hashes))
		for i, h := range hashes {
			if !validHash(h) {
				return nil, badRequest("invalid mm_hash %q", h)
			}
			if kwargs[i] == nil {
				return nil, badRequest("features.kwargs_data.image[%d] is null", i)
			}
			data, err := base64.StdEncoding.DecodeString(*kwargs[i])
			if err != nil {
				data = []byte(*kwargs[i])
			}
			items[i] = encodeItem{hash: h, size: len(data), output: func() []byte { return data }}
		}
		return items, nil
	default:
		return nil, badRequest("encode worker serves only %s and %s", PathChatCompletions, PathGenerate)
	}
}

// verifyEC checks that the encoder outputs of every image of the request are
// available. Strict checks (prefill legs) require them; lenient checks (local
// computation) verify ec_transfer_params only when the request carries them,
// since the worker could encode the images itself.
func (w *Worker) verifyEC(ctx context.Context, in *inference, strict bool) *apiError {
	// Items that carry their preprocessed inputs (kwargs_data) are encoded inline by this worker,
	// as vLLM does for tokens-in requests; only the others (metadata-only items among them) need
	// encoder outputs.
	if in.features == nil {
		return nil
	}
	var hashes []string
	kwargs := in.features.imageKwargs
	for i, h := range in.features.imageHashes {
		if i < len(kwargs) && kwargs[i] != nil {
			continue
		}
		hashes = append(hashes, h)
	}
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
		// The item's mm_metadata, when it has one, must describe the image the encoder encoded.
		if m := in.features.metadataFor(h); m != nil && ImageKwargsSize(m.Size) != peer.SizeBytes {
			return fmt.Errorf("mm_hash %s: mm_metadata describes a %d-byte image, the encoder output has size_bytes=%d (want %d)",
				h, m.Size, peer.SizeBytes, ImageKwargsSize(m.Size))
		}
	}
	return nil
}
