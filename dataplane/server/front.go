package server

import (
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
	"github.com/epd-dev/coordinator/dataplane/base/logging"
	"github.com/epd-dev/coordinator/dataplane/wire"
)

// passthroughMethods are the methods the OpenAI API uses; other /v1 requests with another method
// are refused, not forwarded.
var passthroughMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodDelete}

var allowPassthrough = strings.Join(passthroughMethods, ", ")

// front routes on the canonical path (see cleanPath) and refuses what no route may serve: a
// path that climbs out of /v1/, a method other than POST on an inference path, and a method the
// OpenAI API does not use on any other /v1 path. It runs before echo's routing.
func (s *Server) front(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		if clean, err := cleanPath(req.URL); err != nil {
			return err
		} else if clean != req.URL.Path || req.URL.RawPath != "" {
			s.log.V(logging.Verbose).Info("normalised the request path", "request_id", exchangeOf(c).id,
				"raw_path", truncate(req.URL.EscapedPath(), 256), "path", clean)
			req.URL.Path, req.URL.RawPath = clean, ""
		}
		p := req.URL.Path
		switch {
		case slices.Contains(wire.ClientPaths, p), p == wire.CountTokensPath:
			if req.Method != http.MethodPost {
				c.Response().Header().Set("Allow", http.MethodPost)
				return echo.ErrMethodNotAllowed
			}
		case strings.HasPrefix(p, "/v1/"):
			if !slices.Contains(passthroughMethods, req.Method) {
				c.Response().Header().Set("Allow", allowPassthrough)
				return echo.ErrMethodNotAllowed
			}
		}
		return next(c)
	}
}

// cleanPath is the canonical form of a request path: percent-decoded once (net/http did it:
// %2e and %2f are a dot and a slash), backslashes as slashes, dot segments resolved and repeated
// slashes merged, a trailing slash kept. It refuses control characters and a percent-encoding
// left after decoding (double encoding), which a worker may decode once more (400), and a path
// that started in /v1/ and climbs out of it (404).
func cleanPath(u *url.URL) (string, error) {
	p := u.Path
	if p == "" || p[0] != '/' {
		return p, nil // not origin-form (net/http answers OPTIONS * itself; CONNECT's authority)
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c < 0x20 || c == 0x7f:
			return "", apierror.BadRequest("invalid_path", "the request path has a control character")
		case c == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]):
			return "", apierror.BadRequest("invalid_path", "the request path is percent-encoded twice")
		}
	}
	p = strings.ReplaceAll(p, `\`, "/")
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	if strings.HasPrefix(mergeSlashes(p), "/v1/") && !strings.HasPrefix(clean, "/v1/") {
		return "", &apierror.Error{Status: http.StatusNotFound, Type: apierror.TypeNotFound, Code: "not_found",
			Message: "no such route: the path leaves /v1/"}
	}
	return clean, nil
}

func mergeSlashes(p string) string {
	for strings.Contains(p, "//") {
		p = strings.ReplaceAll(p, "//", "/")
	}
	return p
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
