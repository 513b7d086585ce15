package mediaserver

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"mime"
	"net/http"
	"strconv"
	"testing"
)

// The audio and video files are well-formed (checkWAV, checkMP3, checkMP4, checkWebM), sniffed
// as their type, deterministic and sized by their name; ?type= mislabels them or drops the
// Content-Type.
func TestAudioVideoFiles(t *testing.T) {
	s := startServer(t)
	tests := map[string]struct {
		path, ctype, sniffed string
		gen                  func(string) []byte
		check                func([]byte) error
	}{
		"wav":  {"/audio/%s.wav", "audio/wav", "audio/wave", WAV, checkWAV},
		"mp3":  {"/audio/%s.mp3", "audio/mpeg", "audio/mpeg", MP3, checkMP3},
		"mp4":  {"/video/%s.mp4", "video/mp4", "video/mp4", MP4, checkMP4},
		"webm": {"/video/%s.webm", "video/webm", "video/webm", WebM, checkWebM},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			sizes := map[int]bool{}
			for _, file := range []string{"a", "b", "clip", "a-much-longer-name"} {
				resp, body := get(t, s.URL()+fmt.Sprintf(tc.path, file))
				if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != tc.ctype || resp.Header.Get("Content-Length") != strconv.Itoa(len(body)) {
					t.Fatalf("%s: status %d headers %v", file, resp.StatusCode, resp.Header)
				}
				if !bytes.Equal(body, tc.gen(file)) || !bytes.Equal(tc.gen(file), tc.gen(file)) {
					t.Fatalf("%s: the body is not the deterministic file", file)
				}
				if ct, _, _ := mime.ParseMediaType(http.DetectContentType(body)); ct != tc.sniffed {
					t.Fatalf("%s sniffs as %s, want %s", file, ct, tc.sniffed)
				}
				if err := tc.check(body); err != nil {
					t.Fatalf("%s is malformed: %v", file, err)
				}
				sizes[len(body)] = true
			}
			if len(sizes) < 3 {
				t.Errorf("sizes do not vary with the name: %v", sizes)
			}
			file := fmt.Sprintf(tc.path, "x")
			resp, body := get(t, s.URL()+file+"?type=image/png")
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "image/png" || !bytes.Equal(body, tc.gen("x")) {
				t.Fatalf("mislabelled: %d %v", resp.StatusCode, resp.Header)
			}
			resp, body = get(t, s.URL()+file+"?type=none")
			if _, has := resp.Header["Content-Type"]; resp.StatusCode != http.StatusOK || has || !bytes.Equal(body, tc.gen("x")) {
				t.Fatalf("untyped: %d %v", resp.StatusCode, resp.Header)
			}
		})
	}
	for path, status := range map[string]int{
		"/audio/x.mp4":              http.StatusNotFound, // video under /audio
		"/video/x.wav":              http.StatusNotFound,
		"/audio/x.flac":             http.StatusNotFound,
		"/audio/.wav":               http.StatusNotFound,
		"/audio/x.wav?type=no%20ct": http.StatusBadRequest,
		"/img/x.png?type=audio/wav": http.StatusOK,
	} {
		if resp, _ := get(t, s.URL()+path); resp.StatusCode != status {
			t.Errorf("%s: %d, want %d", path, resp.StatusCode, status)
		}
	}
	if resp, body := get(t, s.URL()+"/img/x.png?type=audio/wav"); resp.Header.Get("Content-Type") != "audio/wav" || !bytes.Equal(body, PNG("x")) {
		t.Errorf("a PNG labelled audio/wav: %v", resp.Header)
	}
}

// checkWAV parses a canonical PCM WAV file: RIFF size, fmt chunk, data chunk to the end.
func checkWAV(b []byte) error {
	le := binary.LittleEndian
	switch {
	case len(b) < 44 || string(b[:4]) != "RIFF" || string(b[8:16]) != "WAVEfmt ":
		return fmt.Errorf("no RIFF/WAVE/fmt header: %q", b[:min(len(b), 16)])
	case int(le.Uint32(b[4:])) != len(b)-8:
		return fmt.Errorf("RIFF size %d, file %d bytes", le.Uint32(b[4:]), len(b))
	case le.Uint32(b[16:]) != 16 || le.Uint16(b[20:]) != 1:
		return fmt.Errorf("fmt chunk of %d bytes, format %d: want 16-byte PCM", le.Uint32(b[16:]), le.Uint16(b[20:]))
	}
	channels, rate, byteRate, align, depth := le.Uint16(b[22:]), le.Uint32(b[24:]), le.Uint32(b[28:]), le.Uint16(b[32:]), le.Uint16(b[34:])
	if byteRate != rate*uint32(align) || align != channels*depth/8 {
		return fmt.Errorf("inconsistent format: %d channels, %d Hz, %d B/s, align %d, %d bits", channels, rate, byteRate, align, depth)
	}
	if string(b[36:40]) != "data" || int(le.Uint32(b[40:])) != len(b)-44 || (len(b)-44)%int(align) != 0 {
		return fmt.Errorf("data chunk %q of %d bytes, %d left", b[36:40], le.Uint32(b[40:]), len(b)-44)
	}
	return nil
}

// checkMP3 parses an ID3v2 tag and the MPEG frames after it, each 417 bytes (128 kbit/s,
// 44.1 kHz, no padding), to the end.
func checkMP3(b []byte) error {
	if len(b) < 10 || string(b[:3]) != "ID3" {
		return fmt.Errorf("no ID3v2 tag")
	}
	size := int(b[6])<<21 | int(b[7])<<14 | int(b[8])<<7 | int(b[9])
	rest := b[10+size:]
	frames := 0
	for len(rest) > 0 {
		h := rest[:4]
		if h[0] != 0xFF || h[1]&0xE0 != 0xE0 || h[1]>>3&3 != 3 || h[1]>>1&3 != 1 || h[2]>>4 != 9 || h[2]>>2&3 != 0 {
			return fmt.Errorf("frame %d: header %x is not MPEG-1 Layer III, 128 kbit/s, 44.1 kHz", frames, h)
		}
		n := 144*128000/44100 + int(h[2]>>1&1)
		if len(rest) < n {
			return fmt.Errorf("frame %d cut short: %d of %d bytes", frames, len(rest), n)
		}
		rest, frames = rest[n:], frames+1
	}
	if frames < 2 {
		return fmt.Errorf("%d frames", frames)
	}
	return nil
}

// checkMP4 walks the top-level ISO BMFF boxes to the end: ftyp first (with an mp4 brand), a moov
// holding an mvhd, an mdat.
func checkMP4(b []byte) error {
	var types []string
	for off := 0; off < len(b); {
		if len(b)-off < 8 {
			return fmt.Errorf("a box header cut short at %d", off)
		}
		size := int(binary.BigEndian.Uint32(b[off:]))
		if size < 8 || off+size > len(b) {
			return fmt.Errorf("box %q at %d has size %d, %d bytes left", b[off+4:off+8], off, size, len(b)-off)
		}
		typ := string(b[off+4 : off+8])
		if typ == "moov" && (size < 16 || string(b[off+12:off+16]) != "mvhd" || int(binary.BigEndian.Uint32(b[off+8:])) != size-8) {
			return fmt.Errorf("moov does not hold exactly an mvhd")
		}
		if typ == "ftyp" && !bytes.Contains(b[off+8:off+size], []byte("mp4")) {
			return fmt.Errorf("ftyp without an mp4 brand")
		}
		types = append(types, typ)
		off += size
	}
	if fmt.Sprint(types) != "[ftyp moov mdat]" {
		return fmt.Errorf("boxes %v", types)
	}
	return nil
}

// vint reads an EBML variable-size integer (the marker bit removed) and its length.
func vint(b []byte) (uint64, int, error) {
	if len(b) == 0 || b[0] == 0 {
		return 0, 0, fmt.Errorf("no vint")
	}
	n := bits.LeadingZeros8(b[0]) + 1
	if len(b) < n {
		return 0, 0, fmt.Errorf("vint cut short")
	}
	v := uint64(b[0] & (0xFF >> n))
	for _, c := range b[1:n] {
		v = v<<8 | uint64(c)
	}
	return v, n, nil
}

// ebmlElements walks the EBML elements of b to its end and returns their ids.
func ebmlElements(b []byte) ([][]byte, [][]byte, error) {
	var ids, bodies [][]byte
	for off := 0; off < len(b); {
		_, idLen, err := vint(b[off:])
		if err != nil {
			return nil, nil, fmt.Errorf("at %d: %w", off, err)
		}
		size, sizeLen, err := vint(b[off+idLen:])
		if err != nil {
			return nil, nil, fmt.Errorf("at %d: %w", off, err)
		}
		start := off + idLen + sizeLen
		if start+int(size) > len(b) {
			return nil, nil, fmt.Errorf("element %x at %d: %d bytes, %d left", b[off:off+idLen], off, size, len(b)-start)
		}
		ids, bodies = append(ids, b[off:off+idLen]), append(bodies, b[start:start+int(size)])
		off = start + int(size)
	}
	return ids, bodies, nil
}

// checkWebM walks the EBML header (DocType webm) and the Segment (Info, then a Void) to the end.
func checkWebM(b []byte) error {
	ids, bodies, err := ebmlElements(b)
	if err != nil {
		return err
	}
	if len(ids) != 2 || !bytes.Equal(ids[0], []byte{0x1A, 0x45, 0xDF, 0xA3}) || !bytes.Equal(ids[1], []byte{0x18, 0x53, 0x80, 0x67}) {
		return fmt.Errorf("top-level elements %x, want the EBML header and a Segment", ids)
	}
	hids, hbodies, err := ebmlElements(bodies[0])
	if err != nil {
		return fmt.Errorf("EBML header: %w", err)
	}
	docType := ""
	for i, id := range hids {
		if bytes.Equal(id, []byte{0x42, 0x82}) {
			docType = string(hbodies[i])
		}
	}
	if docType != "webm" || len(hids) != 7 {
		return fmt.Errorf("EBML header of %d elements, DocType %q", len(hids), docType)
	}
	sids, sbodies, err := ebmlElements(bodies[1])
	if err != nil {
		return fmt.Errorf("Segment: %w", err)
	}
	if len(sids) != 2 || !bytes.Equal(sids[0], []byte{0x15, 0x49, 0xA9, 0x66}) || !bytes.Equal(sids[1], []byte{0xEC}) {
		return fmt.Errorf("Segment elements %x, want Info and Void", sids)
	}
	if _, _, err := ebmlElements(sbodies[0]); err != nil {
		return fmt.Errorf("Info: %w", err)
	}
	return nil
}
