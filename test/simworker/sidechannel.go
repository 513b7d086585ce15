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

// errNotFound reports a side-channel look-up of an unknown id.
var errNotFound = errors.New("unknown to peer")

// handleKVLookup answers GET /kv/{id} with the registered KVHandle.
func (w *Worker) handleKVLookup(rw http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	h, ok := w.kvHandles.get(id)
	if !ok {
		writeError(rw, http.StatusNotFound, fmt.Sprintf("unknown remote_request_id %q", id))
		return
	}
	writeBody(rw, http.StatusOK, h.appendJSON(nil, id, w.engineID))
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
	u := "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/" + kind + "/" + url.PathEscape(id)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach peer %s: %v", net.JoinHostPort(host, strconv.Itoa(port)), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("reading peer answer: %v", err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return errNotFound
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("peer answered %d", resp.StatusCode)
	}
	if err := decode(body); err != nil {
		return fmt.Errorf("peer answer is not valid JSON: %v", err)
	}
	return nil
}
