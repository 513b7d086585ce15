package logging

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Redaction limits, as upstream's trace logging.
const (
	maxString  = 50
	maxArray   = 10
	maxDepth   = 32
	maxRawBody = 200
)

// RedactJSON returns a JSON body fit for a log line: strings over 50 characters become [base64]
// (data: URLs), [url] (http URLs) or their first 50 characters and "...", arrays keep 10 items
// plus a "... +N more" marker, nesting stops at depth 32. A non-JSON body is cut at 200 bytes.
// Meant for trace level: it decodes the whole body.
func RedactJSON(body []byte) string {
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		if len(body) > maxRawBody {
			return string(body[:maxRawBody]) + "..."
		}
		return string(body)
	}
	b, _ := json.Marshal(redact(v, 0))
	return string(b)
}

func redact(v any, depth int) any {
	if depth >= maxDepth {
		return "[truncated]"
	}
	switch x := v.(type) {
	case string:
		if len(x) <= maxString {
			return x
		}
		switch {
		case strings.HasPrefix(x, "data:"):
			return "[base64]"
		case strings.HasPrefix(x, "http://") || strings.HasPrefix(x, "https://"):
			return "[url]"
		}
		return x[:maxString] + "..."
	case []any:
		n := len(x)
		keep := min(n, maxArray)
		out := make([]any, 0, keep+1)
		for _, it := range x[:keep] {
			out = append(out, redact(it, depth+1))
		}
		if n > keep {
			out = append(out, fmt.Sprintf("... +%d more", n-keep))
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, it := range x {
			out[k] = redact(it, depth+1)
		}
		return out
	}
	return v
}
