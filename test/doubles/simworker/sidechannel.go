package simworker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
)

// Side-channel errors a peer answers.
var (
	// errNotFound reports a side-channel look-up of an unknown id.
	errNotFound = errors.New("unknown to peer")
	// errFreed reports a KV handle a decode already pulled (410 Gone).
	errFreed = errors.New("already transferred")
)

// handleKVLookup answers GET /kv/{id} with the registered KVHandle: the look-up a decode makes
// before it reads the blocks. A handle already pulled is 410 Gone.
func (w *Worker) handleKVLookup(rw http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	h, ok := w.kvHandles.get(id)
	if !ok {
		w.writeKVMissing(rw, id)
		return
	}
	writeBody(rw, http.StatusOK, h.appendJSON(nil, id, w.engineID))
}

// handleKVRelease answers DELETE /kv/{id}, the decode's notice that it has read the blocks
// (vLLM's NIXL completion notification): the prefill worker frees them, so that a later
// look-up or release of the handle is 410 Gone. Of two concurrent releases, one wins.
func (w *Worker) handleKVRelease(rw http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, ok := w.kvHandles.take(id); !ok {
		w.writeKVMissing(rw, id)
		return
	}
	w.kvFreed.put(id, struct{}{})
	rw.WriteHeader(http.StatusNoContent)
}

// writeKVMissing answers a side-channel request for a handle the worker does not hold: 410 when
// a decode pulled it already, 404 when it was never published (or was evicted).
func (w *Worker) writeKVMissing(rw http.ResponseWriter, id string) {
	if w.kvFreed.contains(id) {
		writeError(rw, http.StatusGone, fmt.Sprintf("remote_request_id %q was already transferred; its blocks are freed", id))
		return
	}
	writeError(rw, http.StatusNotFound, fmt.Sprintf("unknown remote_request_id %q", id))
}

// handleECLookup answers GET /ec/{hash} with the registered ECDescriptor.
func (w *Worker) handleECLookup(rw http.ResponseWriter, r *http.Request) {
	d, ok := w.ecDescs.get(r.PathValue("hash"))
	if !ok {
		writeError(rw, http.StatusNotFound, fmt.Sprintf("unknown mm_hash %q", r.PathValue("hash")))
		return
	}
	writeJSON(rw, http.StatusOK, d)
}

// lookup fetches http://host:port/kind/id from a peer worker and decodes the
// answer with decode.
func (w *Worker) lookup(ctx context.Context, host string, port int, kind, id string, decode func([]byte) error) error {
	body, err := w.sideChannel(ctx, http.MethodGet, host, port, kind, id, http.StatusOK)
	if err != nil {
		return err
	}
	if err := decode(body); err != nil {
		return fmt.Errorf("peer answer is not valid JSON: %w", err)
	}
	return nil
}

// release tells the kv-nixl prefill worker at host:port that the blocks of handle id were read,
// so that it frees them (DELETE /kv/{id}).
func (w *Worker) release(ctx context.Context, host string, port int, id string) error {
	_, err := w.sideChannel(ctx, http.MethodDelete, host, port, "kv", id, http.StatusNoContent)
	return err
}

// sideChannel sends method http://host:port/kind/id to a peer worker and returns the body of an
// answer with status want; 404 is errNotFound and 410 errFreed.
func (w *Worker) sideChannel(ctx context.Context, method, host string, port int, kind, id string, want int) ([]byte, error) {
	peer := net.JoinHostPort(host, strconv.Itoa(port))
	req, err := http.NewRequestWithContext(ctx, method, "http://"+peer+"/"+kind+"/"+url.PathEscape(id), nil)
	if err != nil {
		return nil, err
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach peer %s: %w", peer, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("reading peer answer: %w", err)
	}
	switch resp.StatusCode {
	case want:
		return body, nil
	case http.StatusNotFound:
		return nil, errNotFound
	case http.StatusGone:
		return nil, errFreed
	}
	return nil, fmt.Errorf("peer answered %d", resp.StatusCode)
}
