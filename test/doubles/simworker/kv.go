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
	"strconv"
)

// kvBlockSize is the number of tokens per simulated KV block.
const kvBlockSize = 16

// checkPrefillKV validates the kv_transfer_params of a prefill leg before
// anything is computed.
func (w *Worker) checkPrefillKV(in *inference) *apiError {
	if w.kvProtocol(in) != KVSGLang {
		return nil
	}
	if _, err := in.bootstrapOf(false); err != nil {
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
		return w.prefillSGLang(r, in)
	case KVSharedStorage:
		if err := w.writeKVFile(in); err != nil {
			return nil, &apiError{status: http.StatusInternalServerError, msg: "KV store failed: " + err.Error()}
		}
		return nil, nil
	default:
		n := max((len(in.promptIDs)+kvBlockSize-1)/kvBlockSize, 1)
		h := kvHandle{
			firstBlock: int(w.blockSeq.Add(int64(n))) - n,
			numBlocks:  n,
			promptKey:  in.promptKey,
			numTokens:  len(in.promptIDs),
		}
		id := w.newID(w.cfg.Name + "-kv-")
		w.kvHandles.put(id, h)
		return NixlKVParams{
			DoRemotePrefill: true,
			RemoteBlockIDs:  [][]int{h.blockIDs()},
			RemoteEngineID:  w.engineID,
			RemoteRequestID: id,
			RemoteHost:      host,
			RemotePort:      port,
			TPSize:          1,
			RemoteNumTokens: h.numTokens,
			RemoteDPRank:    dataParallelRank(r),
		}, nil
	}
}

// DataParallelRankHeader pins a request to one data-parallel rank of a vLLM
// server.
const DataParallelRankHeader = "X-Data-Parallel-Rank"

// dataParallelRank is the request's X-Data-Parallel-Rank when it is a
// non-negative integer, the rank a data-parallel vLLM runs it on (nil
// otherwise: the worker has no ranks of its own to pick from).
func dataParallelRank(r *http.Request) *int {
	n, err := strconv.Atoi(r.Header.Get(DataParallelRankHeader))
	if err != nil || n < 0 {
		return nil
	}
	return &n
}

// kvHandle is a published KV cache as a kv-nixl prefill worker keeps it:
// its blocks are consecutive, so it takes a few words however long the
// prompt.
type kvHandle struct {
	firstBlock, numBlocks int
	promptKey             string
	numTokens             int
}

// blockIDs returns the handle's block ids.
func (h kvHandle) blockIDs() []int {
	ids := make([]int, h.numBlocks)
	for i := range ids {
		ids[i] = h.firstBlock + i
	}
	return ids
}

// appendJSON appends the handle as GET /kv/{id} serves it: the encoding/json
// encoding of the KVHandle, written directly (a long prompt has thousands of
// blocks, which encoding/json would encode one reflective call at a time).
func (h kvHandle) appendJSON(dst []byte, id, engineID string) []byte {
	dst = append(dst, `{"remote_request_id":`...)
	dst = appendMarshaled(dst, id)
	dst = append(dst, `,"remote_engine_id":`...)
	dst = appendMarshaled(dst, engineID)
	dst = append(dst, `,"remote_block_ids":[[`...)
	for i := range h.numBlocks {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(h.firstBlock+i), 10)
	}
	dst = append(dst, `]],"prompt_key":`...)
	dst = appendMarshaled(dst, h.promptKey)
	dst = append(dst, `,"num_tokens":`...)
	dst = strconv.AppendInt(dst, int64(h.numTokens), 10)
	return append(dst, '}')
}

// kvProtocol is the configured connector, or with KVAuto the one the request's params speak.
func (w *Worker) kvProtocol(in *inference) KVConnector {
	if w.cfg.KVConnector != KVAuto {
		return w.cfg.KVConnector
	}
	switch {
	case in.bootstrap != nil || in.kv["bootstrap_room"] != nil || in.kv["bootstrap_port"] != nil:
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
		err = w.decodeSGLang(ctx, in)
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

// verifyNixl looks the KV handle up on the prefill worker, compares it with
// what the decode request carries and then releases it, as a vLLM decode frees
// the remote blocks it has read: the same handle cannot be pulled twice.
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
	raw, ok := in.kv["remote_block_ids"]
	if !ok || isNull(raw) {
		return fmt.Errorf("missing %s.remote_block_ids", in.kvName)
	}
	blocks, err := blockIDs(raw)
	if err != nil {
		return fmt.Errorf("%s.remote_block_ids must be a list of lists of integers", in.kvName)
	}
	var h KVHandle
	decode := func(b []byte) (err error) {
		h, err = parseKVHandle(b)
		return err
	}
	peerErr := func(err error) error {
		switch {
		case errors.Is(err, errNotFound):
			return fmt.Errorf("remote_request_id %q unknown to %s:%d", id, host, port)
		case errors.Is(err, errFreed):
			return fmt.Errorf("remote_request_id %q was already pulled from %s:%d (a prefill worker frees the blocks once a decode has read them)", id, host, port)
		}
		return err
	}
	if err := w.lookup(ctx, host, port, "kv", id, decode); err != nil {
		return peerErr(err)
	}
	switch {
	case h.RemoteEngineID != engine:
		return fmt.Errorf("remote_engine_id mismatch: request has %q, prefill worker has %q", engine, h.RemoteEngineID)
	case !slices.EqualFunc(h.RemoteBlockIDs, blocks, slices.Equal[[]int]):
		return fmt.Errorf("remote_block_ids mismatch: request has %v, prefill worker has %v", blocks, h.RemoteBlockIDs)
	case h.PromptKey != in.promptKey:
		return fmt.Errorf("prompt mismatch: KV was computed for prompt %s, decode request is prompt %s", h.PromptKey, in.promptKey)
	}
	// The blocks are read: the prefill worker frees them, and a second pull of the handle fails.
	return peerErr(w.release(ctx, host, port, id))
}

// parseKVHandle decodes a KVHandle served by a peer's side channel. Its
// block ids can run to thousands: encoding/json would take longer to decode
// them than the worker takes to tokenize the prompt.
func parseKVHandle(answer []byte) (KVHandle, error) {
	o, err := parseObject(answer)
	if err != nil {
		return KVHandle{}, err
	}
	f := topFields(o, &err)
	h := KVHandle{
		RemoteRequestID: f.str("remote_request_id"),
		RemoteEngineID:  f.str("remote_engine_id"),
		PromptKey:       f.str("prompt_key"),
	}
	if n := f.integer("num_tokens"); n != nil {
		h.NumTokens = *n
	}
	if raw := f.raw("remote_block_ids"); raw != nil {
		h.RemoteBlockIDs, err = blockIDs(raw)
	}
	return h, err
}

// blockIDs decodes remote_block_ids, a validated list of lists of integers.
func blockIDs(raw []byte) ([][]int, error) {
	lists, err := nestedArray(raw, "remote_block_ids")
	if err != nil {
		return nil, err
	}
	blocks := make([][]int, len(lists))
	for i, l := range lists {
		if blocks[i], err = jsonInts(l, "remote_block_ids"); err != nil {
			return nil, err
		}
	}
	return blocks, nil
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
