package ratelimit

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
)

// OpenAI's rate-limit response headers.
const (
	HeaderLimitRequests     = "X-Ratelimit-Limit-Requests"
	HeaderRemainingRequests = "X-Ratelimit-Remaining-Requests"
	HeaderResetRequests     = "X-Ratelimit-Reset-Requests"
	HeaderLimitTokens       = "X-Ratelimit-Limit-Tokens"
	HeaderRemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	HeaderResetTokens       = "X-Ratelimit-Reset-Tokens"
)

// SetHeaders writes the x-ratelimit-* headers of each limit the tenant has, as OpenAI does on
// every answer: the bucket's capacity, what remains, and the time until it is full again
// ("1s", "6m0s", "20ms"). A decision without a check (no limits, Redis failed open or closed)
// writes none.
func (d Decision) SetHeaders(h http.Header) {
	if d.Source != SourceRedis && d.Source != SourceLocal {
		return
	}
	set := func(limit, remaining, reset string, w Window) {
		if w.Limit == 0 {
			return
		}
		h[limit] = []string{strconv.FormatInt(w.Limit, 10)}
		h[remaining] = []string{strconv.FormatInt(w.Remaining, 10)}
		h[reset] = []string{FormatReset(w.Reset)}
	}
	set(HeaderLimitRequests, HeaderRemainingRequests, HeaderResetRequests, d.Requests)
	set(HeaderLimitTokens, HeaderRemainingTokens, HeaderResetTokens, d.Tokens)
}

// FormatReset formats a reset time as OpenAI does: milliseconds below a second ("20ms"), else
// Go's duration to the millisecond ("1s", "1.5s", "6m0s").
func FormatReset(d time.Duration) string {
	if d < time.Second {
		return strconv.FormatInt(int64((d+time.Millisecond-1)/time.Millisecond), 10) + "ms"
	}
	return d.Round(time.Millisecond).String()
}

// Error is the client's error of a refused decision: 429 rate_limit_exceeded naming the limit,
// or 503 when Redis failed and on_redis_failure is closed; Retry-After is when it could pass.
func (d Decision) Error() *apierror.Error {
	if d.Refused == LimitUnavailable {
		return &apierror.Error{Status: http.StatusServiceUnavailable, Type: apierror.TypeUnavailable, Code: "rate_limit_unavailable",
			RetryAfter: d.RetryAfter, Message: "the rate limiter cannot reach its store; limited requests are refused until it is back"}
	}
	var msg string
	if d.Refused == LimitTokens {
		msg = fmt.Sprintf("rate limit reached on tokens per minute: limit %d, remaining %d, requested %d; retry in %s",
			d.Tokens.Limit, d.Tokens.Remaining, d.Requested, FormatReset(d.RetryAfter))
	} else {
		msg = fmt.Sprintf("rate limit reached on requests: limit %d per second; retry in %s", d.Requests.Limit, FormatReset(d.RetryAfter))
	}
	return &apierror.Error{Status: http.StatusTooManyRequests, Type: apierror.TypeRateLimit, Code: "rate_limit_exceeded",
		RetryAfter: d.RetryAfter, Message: msg}
}
