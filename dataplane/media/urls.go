package media

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/epd-dev/coordinator/dataplane/base/apierror"
)

// RefuseRemote is the 400 for a conversational request that names a remote URL (RemoteURL)
// when its pipeline has no step guarding media (pipeline.GuardsMedia): the worker would fetch it
// itself, past the media guard.
func RefuseRemote(data []byte) error {
	if !mayNameURL(data) {
		// The common case, data: URLs included, without a parse: no URL can be spelled without
		// ":/", or, escaped, ":\/" (":\t/"...) or "\u003a".
		return nil
	}
	if where, found := RemoteURL(data); found {
		return apierror.InvalidField(where, "%s: remote URLs are refused: this pipeline has no replace-media-urls step to download them "+
			"through the media guard; send the media inline as a data: URL", where)
	}
	return nil
}

// mayNameURL reports whether data holds ":/", ":\" or "\u", without which no URL can be spelled in
// JSON. With AVX2 it is one pass over the body, 64 bytes a step between colons and backslashes
// (a base64 image or plain text has next to none); the three bytes.Contains it replaces, still
// the fallback, were three passes: ~0.75M instructions of a 1 MiB request's ~2M (issue 34).
func mayNameURL(data []byte) bool {
	if !hasAVX2 {
		return bytes.Contains(data, []byte(":/")) || bytes.Contains(data, []byte(`:\`)) || bytes.Contains(data, []byte(`\u`))
	}
	for i := 0; i < len(data); i++ {
		if len(data)-i >= 32 {
			i += skipQuietAVX2(data[i:])
		}
		// To the colon or backslash in the block the vector loop stopped at, or through the tail.
		for i < len(data) && data[i] != ':' && data[i] != '\\' {
			i++
		}
		if i+1 >= len(data) {
			return false
		}
		if c, next := data[i], data[i+1]; c == ':' && (next == '/' || next == '\\') || c == '\\' && next == 'u' {
			return true
		}
	}
	return false
}

// RemoteURL finds, in a JSON body, the first member that holds a URL (urlKey) whose string value
// is an http(s) URL (or one nested in such a member, as in {"image_url": {"url": ...}}), and
// returns its path, e.g. input[0].content[1].image_url. A body that is not valid JSON is scanned
// as far as it parses.
func RemoteURL(data []byte) (string, bool) {
	type frame struct {
		array bool
		index int
		key   string
	}
	var stack []frame
	path := func() string {
		var b strings.Builder
		for _, f := range stack {
			if f.array {
				b.WriteString("[" + strconv.Itoa(f.index) + "]")
				continue
			}
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(f.key)
		}
		return b.String()
	}
	// value ends a value in the innermost container: an array moves to its next index, an
	// object waits for its next key.
	value := func() {
		if n := len(stack); n > 0 {
			if stack[n-1].array {
				stack[n-1].index++
			} else {
				stack[n-1].key = ""
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return "", false
		}
		top := len(stack) - 1
		inKeyPosition := top >= 0 && !stack[top].array && stack[top].key == ""
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				stack = append(stack, frame{array: t == '['})
			default:
				stack = stack[:top]
				if len(stack) == 0 {
					return "", false
				}
				value()
			}
		case string:
			if inKeyPosition {
				stack[top].key = t
				continue
			}
			if isRemote(t) && top >= 0 && (urlKey(stack[top].key) || top > 0 && urlKey(stack[top-1].key)) {
				return path(), true
			}
			value()
		default:
			value()
		}
	}
}

// urlKey reports a member name that holds a URL: url or uri, a name ending in _url or _uri, or
// their plurals (image_urls), in any case.
func urlKey(k string) bool {
	k = strings.TrimSuffix(strings.ToLower(k), "s")
	return k == "url" || k == "uri" || strings.HasSuffix(k, "_url") || strings.HasSuffix(k, "_uri")
}

// isRemote reports an http:// or https:// URL (any case).
func isRemote(s string) bool {
	// As Python's urllib (vLLM) reads a URL: leading C0 controls and spaces stripped, tabs and
	// line breaks removed anywhere.
	s = strings.TrimLeftFunc(s, func(r rune) bool { return r <= ' ' })
	s = strings.NewReplacer("\t", "", "\r", "", "\n", "").Replace(s)
	return len(s) >= 7 && strings.EqualFold(s[:7], "http://") || len(s) >= 8 && strings.EqualFold(s[:8], "https://")
}
