package bench

import (
	"bytes"
	"strconv"
	"testing"
	"testing/iotest"
)

// FuzzReadStampedStream: the SSE reader of the latency benchmark never panics, reads a stream
// the same whatever its reads look like, and accepts it only when it ends with data: [DONE] and
// every event carries a stamp; it yields one latency per stamp. The seed corpus is in
// testdata/fuzz/FuzzReadStampedStream/.
func FuzzReadStampedStream(f *testing.F) {
	f.Add([]byte(": sent_ns=1005\ndata: {\"a\":1}\n\n: keep-alive\n\n: sent_ns=1011\ndata: [DONE]\n\n"))
	f.Add([]byte(": sent_ns=1\r\ndata: x\r\n\r\n: sent_ns=2\r\ndata: [DONE]\r\n"))
	f.Add([]byte(": sent_ns=1\ndata: {}\n\n"))
	f.Add([]byte("data: {}\n\n: sent_ns=1\ndata: [DONE]\n\n"))
	f.Add([]byte(": sent_ns=oops\ndata: [DONE]\n\n"))
	f.Add([]byte(": sent_ns=-5\ndata: [DONE]"))
	f.Add([]byte(": sent_ns=+7\ndata: [DONE]"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		clock := int64(0)
		now := func() int64 { clock++; return clock }
		lat, err := ReadStampedStream(bytes.NewReader(stream), now)
		stamps := int64(0)
		var lastData []byte
		for _, line := range bytes.SplitAfter(stream, []byte("\n")) {
			if len(line) >= 64<<10 {
				return // the reader's line bound: covered by its own error
			}
			if _, ok := ParseStamp(line); ok {
				stamps++
			} else if bytes.HasPrefix(line, []byte("data:")) {
				lastData = line
			}
		}
		if err == nil && (!bytes.Equal(bytes.TrimRight(lastData, "\r\n"), []byte("data: [DONE]")) || int64(len(lat)) != stamps) {
			t.Fatalf("accepted %q: %d latencies, %d stamps, last event %q", stream, len(lat), stamps, lastData)
		}
		clock = 0
		lat1, err1 := ReadStampedStream(iotest.OneByteReader(bytes.NewReader(stream)), now)
		if (err == nil) != (err1 == nil) || len(lat1) != len(lat) {
			t.Fatalf("%q read byte by byte: %d latencies, %v; at once: %d, %v", stream, len(lat1), err1, len(lat), err)
		}
	})
}

// FuzzParseStamp: a stamp is accepted only as the prefix and a positive integer.
func FuzzParseStamp(f *testing.F) {
	for _, s := range []string{": sent_ns=1700000000123456789\n", ": sent_ns=42\r\n", ": sent_ns=", ": sent_ns=-5", ": sent_ns=9223372036854775808", "data: {}\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		v, ok := ParseStamp(line)
		if !ok {
			return
		}
		rest := bytes.TrimRight(bytes.TrimPrefix(line, []byte(": sent_ns=")), "\r\n")
		if n, err := strconv.ParseInt(string(rest), 10, 64); v <= 0 || err != nil || n != v {
			t.Fatalf("ParseStamp(%q) = %d", line, v)
		}
	})
}
