package simworker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SGLang disaggregation, as the simworker plays it (KVSGLang): a prefill and its decode meet in a
// bootstrap room on the prefill worker's bootstrap server, and neither completes alone.
//
//   - The prefill leg offers its KV in room bootstrap_room and waits for a decode to take it: it
//     answers only then, or fails after Config.BootstrapTimeout (SGLang's prefill waits in its
//     bootstrap queue for the decode that allocates the KV's destination).
//   - The decode leg joins the room on bootstrap_host:bootstrap_port (POST /bootstrap/{room}),
//     which blocks until the prefill has offered, and fails after its own
//     Config.BootstrapTimeout otherwise (SGLang's decode waits for the transfer).
//
// So a prefill sent before its decode, as a sequential coordinator does, times out: both must be
// in flight together, with the prefill's host known when the decode is sent.

// DefaultBootstrapTimeout is SGLang's default bootstrap and transfer wait (300 s).
const DefaultBootstrapTimeout = 300 * time.Second

// maxRooms bounds the bootstrap rooms open at once on one worker.
const maxRooms = 4096

// PathBootstrap is the bootstrap server's route: POST PathBootstrap + room joins a room.
const PathBootstrap = "/bootstrap/"

// Errors of a bootstrap wait.
var (
	errBootstrapTimeout = errors.New("bootstrap timed out")
	errRoomsFull        = fmt.Errorf("%d bootstrap rooms are open", maxRooms)
)

// maxRoomKey bounds a room's name (a decimal int64, or a UUID).
const maxRoomKey = 64

// kvOffer is the KV a prefill offers in a room: what the decode checks against its own prompt.
type kvOffer struct {
	PromptKey string `json:"prompt_key"`
	NumTokens int    `json:"num_tokens"`
	Worker    string `json:"worker"`
}

// room is one prefill/decode meeting point.
type room struct {
	refs    int
	offer   kvOffer
	offered chan struct{} // closed when the prefill offers
	taken   chan struct{} // closed when a decode takes the offer
	isOffer bool
	isTaken bool
}

// rendezvous holds a worker's open bootstrap rooms.
type rendezvous struct {
	mu    sync.Mutex
	rooms map[string]*room
}

// acquire returns room key, created when absent; release gives it back.
func (z *rendezvous) acquire(key string) (*room, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	rm := z.rooms[key]
	if rm == nil {
		if len(z.rooms) >= maxRooms {
			return nil, errRoomsFull
		}
		if z.rooms == nil {
			z.rooms = map[string]*room{}
		}
		rm = &room{offered: make(chan struct{}), taken: make(chan struct{})}
		z.rooms[key] = rm
	}
	rm.refs++
	return rm, nil
}

func (z *rendezvous) release(key string, rm *room) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if rm.refs--; rm.refs == 0 {
		delete(z.rooms, key)
	}
}

// open reports how many rooms are open (a prefill or decode waiting in them).
func (z *rendezvous) open() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return len(z.rooms)
}

// offerKV offers o in room key and waits until a decode takes it, ctx ends or timeout passes.
func (z *rendezvous) offerKV(ctx context.Context, key string, o kvOffer, timeout time.Duration) error {
	rm, err := z.acquire(key)
	if err != nil {
		return err
	}
	defer z.release(key, rm)
	z.mu.Lock()
	if rm.isOffer {
		z.mu.Unlock()
		return fmt.Errorf("bootstrap room %s already has a prefill", key)
	}
	rm.isOffer, rm.offer = true, o
	close(rm.offered)
	z.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-rm.taken:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return errBootstrapTimeout
	}
}

// take waits until room key has an offer and takes it (once), or ctx ends or timeout passes.
func (z *rendezvous) take(ctx context.Context, key string, timeout time.Duration) (kvOffer, error) {
	rm, err := z.acquire(key)
	if err != nil {
		return kvOffer{}, err
	}
	defer z.release(key, rm)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-rm.offered:
	case <-ctx.Done():
		return kvOffer{}, context.Cause(ctx)
	case <-t.C:
		return kvOffer{}, errBootstrapTimeout
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if rm.isTaken {
		return kvOffer{}, fmt.Errorf("bootstrap room %s already has a decode", key)
	}
	rm.isTaken = true
	close(rm.taken)
	return rm.offer, nil
}

// sglangBootstrap is the SGLang bootstrap a leg carries.
type sglangBootstrap struct {
	host string // "" on a prefill leg of the sequential connector, which sends none
	port int
	room string          // the room's key
	raw  json.RawMessage // bootstrap_room as sent (an integer, or a string)
}

// bootstrapOf reads the leg's bootstrap fields: SGLang's own, at the top level of the body
// (in.bootstrap, what upstream's prefill-decode step sends), or else those of kv_transfer_params
// (the sequential kv-sglang connector). Host is required on decode legs only.
func (in *inference) bootstrapOf(decode bool) (sglangBootstrap, error) {
	p, name := in.bootstrap, "request"
	if p == nil {
		p, name = in.kv, in.kvName
	}
	var b sglangBootstrap
	var err error
	if decode {
		if b.host, err = p.requireString(name, "bootstrap_host"); err != nil {
			return b, err
		}
	} else if b.host, _, err = p.str(name, "bootstrap_host"); err != nil {
		return b, err
	}
	if b.port, err = p.requirePort(name, "bootstrap_port"); err != nil {
		return b, err
	}
	b.raw = p["bootstrap_room"]
	var n int64
	var s string
	switch {
	case isNull(b.raw):
		return b, fmt.Errorf("missing %s.bootstrap_room", name)
	case json.Unmarshal(b.raw, &n) == nil && n >= 0:
		b.room = strconv.FormatInt(n, 10)
	case json.Unmarshal(b.raw, &s) == nil && s != "" && len(s) <= maxRoomKey:
		b.room = s
	default:
		return b, fmt.Errorf("%s.bootstrap_room must be a non-negative integer or a string of at most 64 characters", name)
	}
	return b, nil
}

// prefillSGLang offers the prompt's KV in the leg's room and waits for its decode.
func (w *Worker) prefillSGLang(r *http.Request, in *inference) (any, *apiError) {
	b, err := in.bootstrapOf(false)
	if err != nil {
		return nil, badRequest("%v", err)
	}
	offer := kvOffer{PromptKey: in.promptKey, NumTokens: len(in.promptIDs), Worker: w.cfg.Name}
	switch err := w.rooms.offerKV(r.Context(), b.room, offer, w.cfg.BootstrapTimeout); {
	case errors.Is(err, errRoomsFull):
		return nil, &apiError{status: http.StatusServiceUnavailable, msg: "KV transfer failed: " + err.Error()}
	case errors.Is(err, errBootstrapTimeout):
		return nil, &apiError{status: http.StatusInternalServerError, msg: fmt.Sprintf(
			"KV transfer failed: bootstrap room %s: no decode joined within %s (SGLang's prefill waits for its decode: send both together)",
			b.room, w.cfg.BootstrapTimeout)}
	case err != nil:
		return nil, &apiError{status: http.StatusServiceUnavailable, msg: "KV transfer failed: " + err.Error()}
	}
	host, _ := w.advertised(r)
	if b.host != "" {
		host = b.host
	}
	return map[string]json.RawMessage{
		"bootstrap_host": mustMarshal(host),
		"bootstrap_port": mustMarshal(b.port),
		"bootstrap_room": b.raw,
	}, nil
}

// decodeSGLang joins the leg's room on the prefill worker's bootstrap server and checks that the
// KV it gets is its prompt's.
func (w *Worker) decodeSGLang(ctx context.Context, in *inference) error {
	b, err := in.bootstrapOf(true)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.BootstrapTimeout)
	defer cancel()
	peer := net.JoinHostPort(b.host, strconv.Itoa(b.port))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+peer+PathBootstrap+url.PathEscape(b.room), http.NoBody)
	if err != nil {
		return err
	}
	resp, err := w.bootstrapClient.Do(req)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("bootstrap room %s on %s: no prefill within %s", b.room, peer, w.cfg.BootstrapTimeout)
	case err != nil:
		return fmt.Errorf("cannot reach the bootstrap server %s: %w", peer, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return fmt.Errorf("bootstrap server %s broke off: %w", peer, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bootstrap server %s answered %d: %s", peer, resp.StatusCode, strings.TrimSpace(string(answer)))
	}
	var o kvOffer
	if err := json.Unmarshal(answer, &o); err != nil {
		return fmt.Errorf("bootstrap server %s: %w", peer, err)
	}
	if o.PromptKey != in.promptKey {
		return fmt.Errorf("prompt mismatch: the KV of room %s was computed for prompt %s, decode request is prompt %s", b.room, o.PromptKey, in.promptKey)
	}
	return nil
}

// handleBootstrap answers POST /bootstrap/{room}, a decode joining a room: once the room's
// prefill has offered its KV, with that KV; 504 after Config.BootstrapTimeout without one.
func (w *Worker) handleBootstrap(rw http.ResponseWriter, r *http.Request) {
	key := r.PathValue("room")
	if len(key) > maxRoomKey {
		writeError(rw, http.StatusBadRequest, fmt.Sprintf("a bootstrap room is named in at most %d characters", maxRoomKey))
		return
	}
	o, err := w.rooms.take(r.Context(), key, w.cfg.BootstrapTimeout)
	switch {
	case errors.Is(err, errRoomsFull):
		writeError(rw, http.StatusServiceUnavailable, err.Error())
	case errors.Is(err, errBootstrapTimeout):
		writeError(rw, http.StatusGatewayTimeout, fmt.Sprintf("bootstrap room %s: no prefill within %s", key, w.cfg.BootstrapTimeout))
	case err != nil:
		writeError(rw, http.StatusConflict, err.Error())
	default:
		writeJSON(rw, http.StatusOK, o)
	}
}

// OpenBootstrapRooms reports how many bootstrap rooms have a prefill or decode waiting in them.
func (w *Worker) OpenBootstrapRooms() int { return w.rooms.open() }

func mustMarshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
