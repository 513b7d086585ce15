package upstream

import (
	"mime"
	"net/http"
	"slices"
	"strings"
)

// RequestIDHeader (x-request-id, in Go's canonical spelling so that setting it allocates nothing)
// carries the request id on every outbound call and on every response.
const RequestIDHeader = "X-Request-Id"

// CoordinatorRequestIDHeader carries, on every leg, the id of the client request the leg is part
// of (x-coordinator-request-id), while x-request-id is the leg's own: the endpoint picker keys
// its per-request state on x-request-id, so legs in flight together must not share one.
const CoordinatorRequestIDHeader = "X-Coordinator-Request-Id"

// hopByHop are connection-level headers never forwarded (RFC 9110 section 7.6.1).
var hopByHop = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// coordinatorOwned are request headers the coordinator sets itself on every outbound call; a
// client cannot spoof them.
var coordinatorOwned = []string{"Host", "Content-Length", "Content-Type", "Accept-Encoding", RequestIDHeader, CoordinatorRequestIDHeader}

// Forwarded returns the client headers an outbound call carries: all of them, with all their
// values, except hop-by-hop headers, headers named in Connection, the ones every call sets itself
// (Host, Content-Length, Content-Type, Accept-Encoding, x-request-id) and the owned ones the
// caller names.
func Forwarded(in http.Header, owned []string) http.Header {
	out := in.Clone()
	dropHopByHop(out, in)
	for _, k := range coordinatorOwned {
		out.Del(k)
	}
	for _, k := range owned {
		out.Del(k)
	}
	return out
}

// responseHeaders are the headers of a worker's answer that reach the client: what describes
// the body (RFC 9110 section 8), what tells the client when to come back, and the headers
// OpenAI-compatible clients read (plus every X-Ratelimit-* header). Nothing else a worker or
// the gateway sets does (Set-Cookie, Server, x-envoy-*, a pod's own headers), unless the
// pipeline names it in forward_response_headers.
var responseHeaders = []string{
	"Content-Type", "Content-Length", "Content-Encoding", "Content-Language", "Cache-Control", "Vary",
	"Retry-After", "Openai-Model", "Openai-Organization", "Openai-Processing-Ms", "Openai-Version",
}

// rateLimitPrefix starts the rate-limit headers OpenAI-compatible servers send.
const rateLimitPrefix = "X-Ratelimit-"

// CopyResponseHeader copies to the client the headers of an upstream response that
// responseHeaders allows or named (canonical names: pipeline.forward_response_headers) names,
// minus hop-by-hop ones. Headers the client's response already has (the coordinator's own
// Connection: close) are kept.
func CopyResponseHeader(dst, src http.Header, named []string) {
	for k, v := range src {
		if (slices.Contains(responseHeaders, k) || strings.HasPrefix(k, rateLimitPrefix) || slices.Contains(named, k)) && !isHopByHop(k, src) {
			dst[k] = v
		}
	}
}

// isHopByHop reports a hop-by-hop header, or one that src's Connection names.
func isHopByHop(k string, src http.Header) bool {
	if slices.Contains(hopByHop, k) {
		return true
	}
	for _, v := range src.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(name)) == k {
				return true
			}
		}
	}
	return false
}

// dropHopByHop deletes from h the hop-by-hop headers and those that src's Connection names.
func dropHopByHop(h, src http.Header) {
	for _, v := range src.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
}

// IsJSON reports a JSON media type (application/json or a +json type) in a Content-Type value.
func IsJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
