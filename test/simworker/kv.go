package simworker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
)

// kvBlockSize is the number of tokens per simulated KV block.
const kvBlockSize = 16

// checkPrefillKV validates the kv_transfer_params of a prefill leg before
// anything is computed.
func (w *Worker) checkPrefillKV(in *inference) *apiError {
	if w.kvProtocol(in) != KVSGLang {
		return nil
	}
	if _, err := in.kv.requirePort(in.kvName, "bootstrap_port"); err != nil {
		return badRequest("%v", err)
	}
	if _, err := in.kv.requireUUID(in.kvName, "bootstrap_room"); err != nil {
		return badRequest("%v", err)
	}
	return nil
}

// producePrefillKV publishes the prompt's KV cache with the configured
// connector and returns the kv_transfer_params to answer (nil for none).
func (w *Worker) producePrefillKV(r *http.Request, in *inference) (any, *apiError) {
	host, port := w.advertised(r)
	switch w.kvProtocol(in) {
	case KVSGLang:
		bport, _ := in.kv.requirePort(in.kvName, "bootstrap_port")
		room, _ := in.kv.requireUUID(in.kvName, "bootstrap_room")
		return SGLangKVParams{BootstrapHost: host, BootstrapPort: bport, BootstrapRoom: room}, nil
	case KVSharedStorage:
		if err := w.writeKVFile(in); err != nil {
			return nil, &apiError{status: http.StatusInternalServerError, msg: "KV store failed: " + err.Error()}
		}
		return nil, nil
	default:
		n := max((len(in.promptIDs)+kvBlockSize-1)/kvBlockSize, 1)
		first := w.blockSeq.Add(int64(n)) - int64(n)
		blocks := make([]int, n)
		for i := range blocks {
			blocks[i] = int(first) + i
		}
		h := KVHandle{
			RemoteRequestID: w.newID(w.cfg.Name + "-kv-"),
			RemoteEngineID:  w.engineID,
			RemoteBlockIDs:  [][]int{blocks},
			PromptKey:       in.promptKey,
			NumTokens:       len(in.promptIDs),
		}
		w.kvHandles.put(h.RemoteRequestID, h)
		return NixlKVParams{
			DoRemotePrefill: true,
			RemoteBlockIDs:  h.RemoteBlockIDs,
			RemoteEngineID:  h.RemoteEngineID,
			RemoteRequestID: h.RemoteRequestID,
			RemoteHost:      host,
			RemotePort:      port,
			TPSize:          1,
			RemoteNumTokens: h.NumTokens,
		}, nil
	}
}

// kvProtocol is the configured connector, or with KVAuto the one the request's params speak.
func (w *Worker) kvProtocol(in *inference) KVConnector {
	if w.cfg.KVConnector != KVAuto {
		return w.cfg.KVConnector
	}
	switch {
	case in.kv["bootstrap_room"] != nil || in.kv["bootstrap_port"] != nil:
		return KVSGLang
	case in.kv["remote_engine_id"] != nil || in.kv["remote_request_id"] != nil:
		return KVNixl
	}
	return KVSharedStorage
}

// kvFile is the content of a shared-storage KV file.
type kvFile struct {
	PromptKey string `json:"prompt_key"`
	NumTokens int    `json:"num_tokens"`
	Worker    string `json:"worker"`
}

// writeKVFile atomically writes KVDir/<prompt key>.
func (w *Worker) writeKVFile(in *inference) error {
	b, err := json.Marshal(kvFile{PromptKey: in.promptKey, NumTokens: len(in.promptIDs), Worker: w.cfg.Name})
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(w.cfg.KVDir, in.promptKey), b)
}

// verifyKV checks the kv_transfer_params of a decode leg with remote prefill.
func (w *Worker) verifyKV(ctx context.Context, in *inference) *apiError {
	var err error
	switch w.kvProtocol(in) {
	case KVSGLang:
		err = verifySGLang(in)
	case KVSharedStorage:
		if _, statErr := os.Stat(filepath.Join(w.cfg.KVDir, in.promptKey)); statErr != nil {
			err = fmt.Errorf("no KV file for prompt %s in %s", in.promptKey, w.cfg.KVDir)
		}
	default:
		err = w.verifyNixl(ctx, in)
	}
	if err != nil {
		return badRequest("KV transfer failed: %v", err)
	}
	return nil
}

// verifySGLang checks that the SGLang bootstrap parameters are well-formed.
func verifySGLang(in *inference) error {
	if _, err := in.kv.requireString(in.kvName, "bootstrap_host"); err != nil {
		return err
	}
	if _, err := in.kv.requirePort(in.kvName, "bootstrap_port"); err != nil {
		return err
	}
	_, err := in.kv.requireUUID(in.kvName, "bootstrap_room")
	return err
}

// verifyNixl looks the KV handle up on the prefill worker and compares it with
// what the decode request carries.
func (w *Worker) verifyNixl(ctx context.Context, in *inference) error {
	id, err := in.kv.requireString(in.kvName, "remote_request_id")
	if err != nil {
		return err
	}
	engine, err := in.kv.requireString(in.kvName, "remote_engine_id")
	if err != nil {
		return err
	}
	host, err := in.kv.requireString(in.kvName, "remote_host")
	if err != nil {
		return err
	}
	port, err := in.kv.requirePort(in.kvName, "remote_port")
	if err != nil {
		return err
	}
	var blocks [][]int
	if raw, ok := in.kv["remote_block_ids"]; !ok || isNull(raw) {
		return fmt.Errorf("missing %s.remote_block_ids", in.kvName)
	} else if json.Unmarshal(raw, &blocks) != nil {
		return fmt.Errorf("%s.remote_block_ids must be a list of lists of integers", in.kvName)
	}
	var h KVHandle
	if err := w.lookup(ctx, host, port, "kv", id, &h); err != nil {
		if errors.Is(err, errNotFound) {
			return fmt.Errorf("remote_request_id %q unknown to %s:%d", id, host, port)
		}
		return err
	}
	switch {
	case h.RemoteEngineID != engine:
		return fmt.Errorf("remote_engine_id mismatch: request has %q, prefill worker has %q", engine, h.RemoteEngineID)
	case !slices.EqualFunc(h.RemoteBlockIDs, blocks, slices.Equal[[]int]):
		return fmt.Errorf("remote_block_ids mismatch: request has %v, prefill worker has %v", blocks, h.RemoteBlockIDs)
	case h.PromptKey != in.promptKey:
		return fmt.Errorf("prompt mismatch: KV was computed for prompt %s, decode request is prompt %s", h.PromptKey, in.promptKey)
	}
	return nil
}

// writeFileAtomic writes b to path through a temporary file and a rename.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return nil
}
