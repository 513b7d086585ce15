package sse

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// feedAll feeds the stream in reads of size n and returns the events in the order they were
// completed, and the error that stopped the reader.
func feedAll(r *Reader, stream string, n int) (string, error) {
	var out bytes.Buffer
	for i := 0; i < len(stream); i += n {
		events, err := r.Feed([]byte(stream[i:min(i+n, len(stream))]))
		out.Write(events)
		if err != nil {
			return out.String(), err
		}
	}
	return out.String(), nil
}

func TestReader(t *testing.T) {
	const two = "data: a\n\ndata: b\nid: 2\n\n"
	tests := map[string]struct {
		stream  string
		limit   int
		want    string // the events returned, concatenated
		pending int
		err     error
	}{
		"whole events":               {stream: two, want: two},
		"a partial event is held":    {stream: two + "data: c", want: two, pending: len("data: c")},
		"CRLF line endings":          {stream: "data: a\r\n\r\ndata: b\r\n\r\n", want: "data: a\r\n\r\ndata: b\r\n\r\n"},
		"a lone LF is no end":        {stream: "data: a\ndata: b\n", pending: len("data: a\ndata: b\n")},
		"an event at the limit":      {stream: "data: abc\n\n", limit: len("data: abc\n\n"), want: "data: abc\n\n"},
		"an event over the limit":    {stream: "data: a\n\ndata: " + strings.Repeat("x", 40), limit: 32, want: "data: a\n\n", err: ErrTooLarge},
		"one that never ends, bound": {stream: strings.Repeat("data: x\n", 100), limit: 64, err: ErrTooLarge},
		"a complete event over the limit, whatever the reads": {stream: "data: a\n\ndata: " + strings.Repeat("x", 40) + "\n\ndata: b\n\n",
			limit: 32, want: "data: a\n\n", err: ErrTooLarge},
	}
	for name, tc := range tests {
		for _, n := range []int{1, 2, 3, 5, 7, 1 << 20} {
			t.Run(fmt.Sprintf("%s/reads of %d", name, n), func(t *testing.T) {
				r := &Reader{Limit: tc.limit}
				got, err := feedAll(r, tc.stream, n)
				if !errors.Is(err, tc.err) || got != tc.want || (err == nil && r.Pending() != tc.pending) {
					t.Fatalf("events %q, pending %d, err %v; want %q, %d, %v", got, r.Pending(), err, tc.want, tc.pending, tc.err)
				}
			})
		}
	}
}

// The reader, fed a stream in any reads, returns what cutting the whole stream gives: its
// complete events up to the first one over the limit, and ErrTooLarge when an event (or the
// partial one at the end) is over it; it never holds more of a partial event than the limit.
// Every stream of up to 8 bytes over "\n", "\r" and "a", in reads of 1, 2, 3 and all bytes, but
// those with a blank line right after an event's end (a run of blank lines may be cut at any of
// them: the empty events between are nothing).
func TestReaderMatchesWholeStream(t *testing.T) {
	blankRun := func(b []byte) bool {
		for _, run := range []string{"\n\n\n", "\n\r\n\n", "\n\n\r\n", "\n\r\n\r\n"} {
			if bytes.Contains(b, []byte(run)) {
				return true
			}
		}
		return false
	}
	want := func(stream []byte, limit int) (string, error) {
		end := max(lastEnd(stream, 0), 0)
		var out []byte
		for ev := range Events(stream[:end]) {
			if limit > 0 && len(ev) > limit {
				return string(out), ErrTooLarge
			}
			out = append(out, ev...)
		}
		if limit > 0 && len(stream)-end > limit {
			return string(out), ErrTooLarge
		}
		return string(out), nil
	}
	checked := 0
	var walk func(b []byte)
	walk = func(b []byte) {
		for _, limit := range []int{0, 2, 3, 4, 6} {
			if blankRun(b) {
				break
			}
			wantOut, wantErr := want(b, limit)
			for _, n := range []int{1, 2, 3, len(b) + 1} {
				r := &Reader{Limit: limit}
				var out []byte
				var err error
				for i := 0; i < len(b) && err == nil; i += n {
					var events []byte
					events, err = r.Feed(b[i:min(i+n, len(b))])
					out = append(out, events...)
					if limit > 0 && r.Pending() > limit {
						t.Fatalf("%q, limit %d, reads of %d: %d bytes of a partial event held", b, limit, n, r.Pending())
					}
				}
				if string(out) != wantOut || !errors.Is(err, wantErr) || (wantErr == nil) != (err == nil) {
					t.Fatalf("%q, limit %d, reads of %d: %q, %v; want %q, %v", b, limit, n, out, err, wantOut, wantErr)
				}
				checked++
			}
		}
		if len(b) < 8 {
			for _, c := range []byte("\n\ra") {
				walk(append(b[:len(b):len(b)], c))
			}
		}
	}
	walk(nil)
	if checked < 50000 {
		t.Fatalf("checked %d cases", checked)
	}
}

// A 2 MiB event, with or without its blank line, fed in the relay's 2 KiB reads to a reader of
// 1 MiB: it fails once the event passes the limit, having held at most the limit.
func TestReaderStopsAtTheLimit(t *testing.T) {
	const limit, read = 1 << 20, 2 << 10
	for name, stream := range map[string]string{
		"no blank line":   "data: " + strings.Repeat("x", 2<<20),
		"with blank line": "data: " + strings.Repeat("x", 2<<20) + "\n\n",
	} {
		t.Run(name, func(t *testing.T) {
			r := &Reader{Limit: limit}
			fed, most := 0, 0
			var err error
			for ; fed < len(stream) && err == nil; fed += read {
				_, err = r.Feed([]byte(stream[fed:min(fed+read, len(stream))]))
				most = max(most, cap(r.buf))
			}
			if !errors.Is(err, ErrTooLarge) || fed > limit+read || most > limit {
				t.Fatalf("err %v after %d bytes, buffer of %d; want ErrTooLarge within %d bytes, a buffer of at most %d", err, fed, most, limit+read, limit)
			}
		})
	}
}

// The events a Feed returns stay valid until the next Feed, even when they were held.
func TestReaderReturnsHeldEvents(t *testing.T) {
	r := &Reader{}
	if ev, _ := r.Feed([]byte("data: a")); ev != nil {
		t.Fatalf("a partial event returned: %q", ev)
	}
	ev, _ := r.Feed([]byte("\n\ndata: b"))
	if string(ev) != "data: a\n\n" || r.Pending() != len("data: b") {
		t.Fatalf("%q, pending %d", ev, r.Pending())
	}
	r.Reset()
	if r.Pending() != 0 {
		t.Fatal("Reset keeps bytes")
	}
}

func TestIterators(t *testing.T) {
	b := []byte("event: x\ndata: 1\ndata:2\n\n: comment\r\ndata: [DONE]\r\n\r\ndata: tail")
	if got := slices.Collect(Events(b)); len(got) != 3 || string(got[0]) != "event: x\ndata: 1\ndata:2\n\n" ||
		string(got[1]) != ": comment\r\ndata: [DONE]\r\n\r\n" || string(got[2]) != "data: tail" {
		t.Fatalf("Events = %q", got)
	}
	var data []string
	for d := range Data(b) {
		data = append(data, string(d))
	}
	if !slices.Equal(data, []string{"1", "2", "[DONE]", "tail"}) {
		t.Fatalf("Data = %q", data)
	}
	if got := string(AppendNamed(nil, "error", []byte(`{}`))); got != "event: error\ndata: {}\n\n" {
		t.Fatalf("AppendNamed = %q", got)
	}
}

// BenchmarkReaderLongEvent feeds one event of each size in 2 KiB reads (the relay's): the time
// per byte stays flat as the event grows (each byte is searched a bounded number of times).
func BenchmarkReaderLongEvent(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 8 << 20} {
		stream := []byte("data: " + strings.Repeat("x", size) + "\n\n")
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(stream)))
			for b.Loop() {
				r := &Reader{}
				for i := 0; i < len(stream); i += 2 << 10 {
					if _, err := r.Feed(stream[i:min(i+2<<10, len(stream))]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// lastEnd against its definition, on every string of up to 9 bytes over "\n", "\r" and "a",
// from every offset: the index past the last "\n\n" or "\n\r\n" that starts at from-3 or later.
func TestLastEndMatchesItsDefinition(t *testing.T) {
	byDefinition := func(b []byte, from int) int {
		from = max(from-3, 0)
		end := -1
		for i := from; i < len(b); i++ {
			if bytes.HasPrefix(b[i:], []byte("\n\n")) {
				end = max(end, i+2)
			}
			if bytes.HasPrefix(b[i:], []byte("\n\r\n")) {
				end = max(end, i+3)
			}
		}
		return end
	}
	var walk func(b []byte)
	checked := 0
	walk = func(b []byte) {
		for from := 0; from <= len(b); from++ {
			if got, want := lastEnd(b, from), byDefinition(b, from); got != want {
				t.Fatalf("lastEnd(%q, %d) = %d, want %d", b, from, got, want)
			}
			checked++
		}
		if len(b) < 9 {
			for _, c := range []byte("\n\ra") {
				walk(append(b[:len(b):len(b)], c))
			}
		}
	}
	walk(nil)
	if checked < 100000 {
		t.Fatalf("checked %d cases", checked)
	}
}
