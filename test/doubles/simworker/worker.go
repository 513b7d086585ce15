package simworker

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epd-dev/coordinator/test/internal/loopback"
)

// maxBodyBytes bounds request bodies (base64 images make them large).
const maxBodyBytes = 64 << 20

// handleCapacity bounds the KV handles and EC descriptors a worker remembers.
const handleCapacity = 1 << 16

// Worker is a simulated vLLM worker. It is an http.Handler; Start also runs it
// on its own listener. All methods are safe for concurrent use.
type Worker struct {
	cfg      Config
	cfgErr   error
	engineID string
	mux      *http.ServeMux
	client   *http.Client

	cache     *lru[string, struct{}]
	kvHandles *lru[string, kvHandle]
	kvFreed   *lru[string, struct{}] // handles a decode has pulled: their blocks are freed
	ecDescs   *lru[string, ECDescriptor]
	rooms     rendezvous // SGLang bootstrap rooms (KVSGLang)
	blockSeq  atomic.Int64
	idSeq     atomic.Uint64

	mu       sync.Mutex
	requests []*Request
	faults   []Fault       // queued, the first one in use
	active   int           // requests being served
	idle     *sync.Cond    // on mu: active dropped to 0
	changed  chan struct{} // closed and replaced whenever requests change

	srv          *loopback.Server
	bootstrapSrv *loopback.Server // Config.BootstrapAddr's
	// bootstrapClient joins bootstrap rooms: its waits are bounded by Config.BootstrapTimeout,
	// not by the side channel's timeout.
	bootstrapClient *http.Client
	closeOnce       sync.Once
}

// Request is one HTTP request a Worker received.
type Request struct {
	Method string
	Path   string
	Query  string
	Header http.Header
	Body   []byte
	Time   time.Time
	// Status is the response status, or 0 while the request is in flight
	// (StatusNoAnswer when a fault cut the connection before any answer).
	Status int
	// Fault is the kind of the injected fault the request drew, if any.
	Fault FaultKind
}

// New returns a Worker serving cfg with defaults applied. New never fails: if
// cfg does not Validate, every inference and render request is answered 500
// with the validation error (Start reports it instead).
func New(cfg Config) *Worker {
	cfg = cfg.withDefaults()
	w := &Worker{
		cfg:      cfg,
		cfgErr:   cfg.Validate(),
		engineID: cfg.Name + "-engine-" + randomHex(4),
		client: &http.Client{
			Timeout:   cfg.SideChannelTimeout,
			Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second},
		},
		bootstrapClient: &http.Client{
			Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second},
		},
		cache:     newLRU[string, struct{}](cfg.CacheSize),
		kvHandles: newLRU[string, kvHandle](handleCapacity),
		kvFreed:   newLRU[string, struct{}](handleCapacity),
		ecDescs:   newLRU[string, ECDescriptor](handleCapacity),
	}
	w.idle, w.changed = sync.NewCond(&w.mu), make(chan struct{})
	w.mux = w.routes()
	return w
}

// Start validates cfg, listens on cfg.Addr (default 127.0.0.1:0) and serves
// a new Worker there until Close.
func Start(cfg Config) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := New(cfg)
	srv, err := loopback.Serve(cfg.Addr, w)
	if err != nil {
		return nil, err
	}
	w.srv = srv
	if cfg.BootstrapAddr != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("POST "+PathBootstrap+"{room}", w.handleBootstrap)
		if w.bootstrapSrv, err = loopback.Serve(cfg.BootstrapAddr, mux); err != nil {
			_ = srv.Close()
			return nil, fmt.Errorf("bootstrap server: %w", err)
		}
	}
	return w, nil
}

// BootstrapURL returns the base URL of the bootstrap server of Config.BootstrapAddr, or "".
func (w *Worker) BootstrapURL() string {
	if w.bootstrapSrv == nil {
		return ""
	}
	return w.bootstrapSrv.URL()
}

// URL returns the base URL of a started Worker ("http://127.0.0.1:port"), or
// "" for a Worker made by New.
func (w *Worker) URL() string {
	if w.srv == nil {
		return ""
	}
	return w.srv.URL()
}

// Close stops a started Worker, cancelling in-flight requests, and releases
// idle side-channel connections. It is safe to call more than once.
func (w *Worker) Close() error {
	var err error
	w.closeOnce.Do(func() {
		if w.srv != nil {
			err = w.srv.Close()
		}
		if w.bootstrapSrv != nil {
			err = errors.Join(err, w.bootstrapSrv.Close())
		}
		w.client.CloseIdleConnections()
		w.bootstrapClient.CloseIdleConnections()
	})
	return err
}

// Kill stops a started Worker the way SIGKILL stops a vLLM process: its
// listener closes, so that dials are refused, and every open connection is
// reset mid-flight (SO_LINGER 0), answers unfinished. It returns once no
// request is being served any more; Close afterwards does nothing. To bring
// the worker back, Start a new one with Addr set to this one's host:port
// (its prefix cache and KV handles are gone, as a restarted process's are).
// On a Worker made by New, whose connections belong to its caller's
// server, Kill only closes idle side-channel connections.
func (w *Worker) Kill() {
	w.client.CloseIdleConnections()
	w.bootstrapClient.CloseIdleConnections()
	if w.srv == nil {
		return
	}
	if w.bootstrapSrv != nil {
		w.bootstrapSrv.Kill()
	}
	w.srv.Kill() // cancels every request context: the handlers return
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.active > 0 {
		w.idle.Wait()
	}
}

// Config returns the worker's configuration with defaults applied.
func (w *Worker) Config() Config { return w.cfg }

// Name returns the worker's name.
func (w *Worker) Name() string { return w.cfg.Name }

// Role returns the worker's role.
func (w *Worker) Role() Role { return w.cfg.Role }

// EngineID returns the stable remote_engine_id this worker advertises.
func (w *Worker) EngineID() string { return w.engineID }

// CacheHas reports whether the prefix cache holds the prompt key (see
// PromptKey and RequestPromptKey).
func (w *Worker) CacheHas(key string) bool { return w.cache.contains(key) }

// CacheAdd puts a prompt key in the prefix cache, as a served request would.
func (w *Worker) CacheAdd(key string) { w.cache.put(key, struct{}{}) }

// CacheLen returns the number of prompts in the prefix cache.
func (w *Worker) CacheLen() int { return w.cache.len() }

// ClearCache empties the prefix cache.
func (w *Worker) ClearCache() { w.cache.clear() }

// Requests returns copies of the requests received so far, oldest first (none
// when Config.DisableRecording is set).
func (w *Worker) Requests() []Request {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Request, len(w.requests))
	for i, r := range w.requests {
		out[i] = *r
		out[i].Header = r.Header.Clone()
	}
	return out
}

// AwaitRequests waits until cond holds for the recorded requests (as
// Requests returns them; cond is checked at once and whenever a request
// arrives or ends) and returns them, or returns them with ctx's error once
// ctx ends. A test waits on it, for example, until a request is in flight
// (Status 0) or served.
func (w *Worker) AwaitRequests(ctx context.Context, cond func([]Request) bool) ([]Request, error) {
	for {
		w.mu.Lock()
		changed := w.changed
		w.mu.Unlock()
		reqs := w.Requests()
		if cond(reqs) {
			return reqs, nil
		}
		select {
		case <-ctx.Done():
			return reqs, ctx.Err()
		case <-changed:
		}
	}
}

// changedLocked wakes AwaitRequests; w.mu must be held.
func (w *Worker) changedLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// Reset forgets the recorded requests and any queued faults. The prefix
// cache is kept (see ClearCache).
func (w *Worker) Reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.requests = nil
	w.faults = nil
	w.changedLocked()
}

// ServeHTTP records the request, applies injected faults and dispatches it.
func (w *Worker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if w.cfg.FaultControl && r.URL.Path == PathFaults {
		w.handleFaults(rw, r) // neither recorded nor faulted
		return
	}
	body, readErr := readBody(rw, r)
	sw := loopback.NewStatusWriter(rw)
	var rec *Request
	if !w.cfg.DisableRecording {
		rec = &Request{
			Method: r.Method,
			Path:   r.URL.Path,
			Query:  r.URL.RawQuery,
			Header: r.Header.Clone(),
			Body:   body,
			Time:   time.Now(),
		}
	}
	w.mu.Lock()
	w.active++
	fault, faulted := w.takeFaultLocked(r, body)
	if rec != nil {
		rec.Fault = fault.Kind
		w.requests = append(w.requests, rec)
		w.changedLocked()
	}
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if rec != nil {
			switch {
			case sw.Status() != 0:
				rec.Status = sw.Status()
			case faulted:
				rec.Status = StatusNoAnswer
			default:
				rec.Status = http.StatusOK // what net/http answers for a handler that wrote nothing
			}
			w.changedLocked()
		}
		if w.active--; w.active == 0 {
			w.idle.Broadcast()
		}
	}()

	if id := r.Header.Get("X-Request-Id"); id != "" {
		rw.Header().Set("X-Request-Id", id)
	}
	r.Body = &bufferedBody{Reader: bytes.NewReader(body), data: body}
	switch {
	case readErr != nil:
		writeError(sw, http.StatusRequestEntityTooLarge, "request body too large")
	case faulted:
		w.serveFault(sw, r, fault, w.mux.ServeHTTP)
	default:
		w.mux.ServeHTTP(sw, r)
	}
}

// readBody reads the request body (at most maxBodyBytes) into a buffer sized
// by Content-Length when the client sent one.
func readBody(rw http.ResponseWriter, r *http.Request) ([]byte, error) {
	var buf bytes.Buffer
	if n := r.ContentLength; n > 0 && n <= maxBodyBytes {
		buf.Grow(int(n) + bytes.MinRead) // room for the final read that sees EOF
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(rw, r.Body, maxBodyBytes))
	return buf.Bytes(), err
}

// bufferedBody is a request body ServeHTTP has read: the handlers take its
// bytes without another copy (see requestBody).
type bufferedBody struct {
	*bytes.Reader
	data []byte
}

// Close implements io.Closer.
func (*bufferedBody) Close() error { return nil }

// requestBody returns the body of a request dispatched by ServeHTTP.
func requestBody(r *http.Request) []byte { return r.Body.(*bufferedBody).data }

// routes builds the worker's request multiplexer.
func (w *Worker) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+PathChatCompletions, w.handleInference(kindChat))
	mux.HandleFunc("POST "+PathCompletions, w.handleInference(kindCompletion))
	mux.HandleFunc("POST "+PathGenerate, w.handleInference(kindGenerate))
	mux.HandleFunc("POST "+PathResponses, w.handleInference(kindResponses))
	mux.HandleFunc("POST "+PathChatRender, w.handleChatRender)
	mux.HandleFunc("POST "+PathCompletionRender, w.handleCompletionRender)
	mux.HandleFunc("GET "+PathModels, w.handleModels)
	mux.HandleFunc("GET "+PathHealth, func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /kv/{id}", w.handleKVLookup)
	mux.HandleFunc("DELETE /kv/{id}", w.handleKVRelease)
	mux.HandleFunc("GET /ec/{hash}", w.handleECLookup)
	mux.HandleFunc("POST "+PathBootstrap+"{room}", w.handleBootstrap)
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		writeError(rw, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// handleModels answers GET /v1/models.
func (w *Worker) handleModels(rw http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	writeJSON(rw, http.StatusOK, struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", []model{{ID: w.cfg.ModelName, Object: "model", Created: time.Now().Unix(), OwnedBy: "simworker"}}})
}

// advertised returns the host and port to put in transfer parameters for a
// request: the configured AdvertiseHost or the local address the request
// arrived on.
func (w *Worker) advertised(r *http.Request) (string, int) {
	host, port := w.cfg.AdvertiseHost, 0
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		port = a.Port
		if host == "" && !a.IP.IsUnspecified() {
			host = a.IP.String()
		}
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return host, port
}

// newID returns a unique id with the given prefix.
func (w *Worker) newID(prefix string) string {
	return prefix + strconv.FormatUint(w.idSeq.Add(1), 10) + "-" + randomHex(4)
}

// randomHex returns 2n random hex digits.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
