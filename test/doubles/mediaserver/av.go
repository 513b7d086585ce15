package mediaserver

import (
	"bytes"
	"encoding/binary"
	"hash/fnv"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Audio and video files: minimal but well-formed (a player or a demuxer reads them), as small as
// a test wants, their size varying with the name, and recognised by content sniffing
// (http.DetectContentType and the WHATWG mimesniff rules): WAV as audio/wave, MP3 (with an ID3v2
// tag) as audio/mpeg, MP4 as video/mp4, WebM as video/webm.

// avFiles maps a file extension of /audio and /video to its generator and media type.
var avFiles = map[string]struct {
	gen   func(string) []byte
	ctype string
}{
	".wav":  {WAV, "audio/wav"},
	".mp3":  {MP3, "audio/mpeg"},
	".mp4":  {MP4, "video/mp4"},
	".webm": {WebM, "video/webm"},
}

// seedOf is the FNV-1a hash of name, which sizes a file.
func seedOf(name string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return h.Sum32()
}

// WAV returns the deterministic WAV file served at /audio/{name}.wav: 16-bit mono PCM at
// 8 kHz, 400 to 1199 samples of a square wave.
func WAV(name string) []byte {
	seed := seedOf(name)
	samples := 400 + int(seed%800)
	data := make([]byte, 2*samples)
	for i := range samples {
		v := int16(4000)
		if (i/(8+int(seed>>8%32)))%2 == 1 {
			v = -4000
		}
		binary.LittleEndian.PutUint16(data[2*i:], uint16(v))
	}
	le := binary.LittleEndian
	b := le.AppendUint32([]byte("RIFF"), uint32(36+len(data)))
	b = append(b, "WAVEfmt "...)
	b = le.AppendUint32(b, 16) // the fmt chunk's size
	b = le.AppendUint16(b, 1)  // PCM
	b = le.AppendUint16(b, 1)  // mono
	b = le.AppendUint32(b, 8000)
	b = le.AppendUint32(b, 16000) // bytes per second
	b = le.AppendUint16(b, 2)     // bytes per sample
	b = le.AppendUint16(b, 16)    // bits per sample
	b = le.AppendUint32(append(b, "data"...), uint32(len(data)))
	return append(b, data...)
}

// mp3Frame is the header of an MPEG-1 Layer III frame: 128 kbit/s, 44.1 kHz, mono, no CRC; its
// frame is 144 * 128000 / 44100 = 417 bytes long.
var mp3Frame = []byte{0xFF, 0xFB, 0x90, 0xC0}

// mp3FrameLen is the length of one mp3Frame frame, header included.
const mp3FrameLen = 417

// MP3 returns the deterministic MP3 file served at /audio/{name}.mp3: an empty ID3v2.3 tag (what
// sniffing recognises) and 2 to 7 frames of silence.
func MP3(name string) []byte {
	frames := 2 + int(seedOf(name)%6)
	b := []byte("ID3\x03\x00\x00\x00\x00\x00\x00")
	for range frames {
		frame := make([]byte, mp3FrameLen)
		copy(frame, mp3Frame)
		b = append(b, frame...)
	}
	return b
}

// box is an ISO BMFF box: its size, type and payload.
func box(typ string, payload ...[]byte) []byte {
	body := bytes.Join(payload, nil)
	out := binary.BigEndian.AppendUint32(nil, uint32(8+len(body)))
	return append(append(out, typ...), body...)
}

// MP4 returns the deterministic MP4 file served at /video/{name}.mp4: an ftyp box (isom, with
// the mp41 brand sniffing looks for), a moov box with its movie header (mvhd: 1000 units a
// second, 1 second long, identity matrix) and an mdat box of 64 to 1087 bytes.
func MP4(name string) []byte {
	seed := seedOf(name)
	mvhd := binary.BigEndian.AppendUint32(nil, 0) // version 0, no flags
	mvhd = binary.BigEndian.AppendUint32(mvhd, 0) // creation time
	mvhd = binary.BigEndian.AppendUint32(mvhd, 0) // modification time
	mvhd = binary.BigEndian.AppendUint32(mvhd, 1000)
	mvhd = binary.BigEndian.AppendUint32(mvhd, 1000)
	mvhd = binary.BigEndian.AppendUint32(mvhd, 0x00010000) // rate 1.0
	mvhd = binary.BigEndian.AppendUint16(mvhd, 0x0100)     // volume 1.0
	mvhd = append(mvhd, make([]byte, 10)...)               // reserved
	for _, v := range []uint32{0x00010000, 0, 0, 0, 0x00010000, 0, 0, 0, 0x40000000} {
		mvhd = binary.BigEndian.AppendUint32(mvhd, v) // the identity matrix
	}
	mvhd = append(mvhd, make([]byte, 24)...)      // pre_defined
	mvhd = binary.BigEndian.AppendUint32(mvhd, 1) // next_track_ID
	mdat := make([]byte, 64+int(seed%1024))
	for i := range mdat {
		mdat[i] = byte(uint32(i)*2654435761>>24) ^ byte(seed)
	}
	return slices.Concat(
		box("ftyp", []byte("isom"), binary.BigEndian.AppendUint32(nil, 0x200), []byte("isommp41")),
		box("moov", box("mvhd", mvhd)),
		box("mdat", mdat),
	)
}

// ebml is an EBML element: its id, its size as an 8-byte vint and its payload.
func ebml(id []byte, payload ...[]byte) []byte {
	body := bytes.Join(payload, nil)
	size := binary.BigEndian.AppendUint64(nil, uint64(len(body)))
	size[0] = 0x01 // an 8-byte vint
	return slices.Concat(id, size, body)
}

// ebmlUint is an EBML element of one unsigned byte.
func ebmlUint(id []byte, v byte) []byte { return ebml(id, []byte{v}) }

// WebM returns the deterministic WebM file served at /video/{name}.webm: the EBML header
// (DocType webm) and a Segment with its Info (TimecodeScale 1 ms, muxing and writing app) and a
// Void element of 16 to 1039 bytes.
func WebM(name string) []byte {
	seed := seedOf(name)
	header := ebml([]byte{0x1A, 0x45, 0xDF, 0xA3},
		ebmlUint([]byte{0x42, 0x86}, 1), // EBMLVersion
		ebmlUint([]byte{0x42, 0xF7}, 1), // EBMLReadVersion
		ebmlUint([]byte{0x42, 0xF2}, 4), // EBMLMaxIDLength
		ebmlUint([]byte{0x42, 0xF3}, 8), // EBMLMaxSizeLength
		ebml([]byte{0x42, 0x82}, []byte("webm")),
		ebmlUint([]byte{0x42, 0x87}, 2), // DocTypeVersion
		ebmlUint([]byte{0x42, 0x85}, 2), // DocTypeReadVersion
	)
	info := ebml([]byte{0x15, 0x49, 0xA9, 0x66},
		ebml([]byte{0x2A, 0xD7, 0xB1}, []byte{0x0F, 0x42, 0x40}), // TimecodeScale 1000000
		ebml([]byte{0x4D, 0x80}, []byte("mediaserver")),          // MuxingApp
		ebml([]byte{0x57, 0x41}, []byte("mediaserver")),          // WritingApp
	)
	void := ebml([]byte{0xEC}, make([]byte, 16+int(seed%1024)))
	return slices.Concat(header, ebml([]byte{0x18, 0x53, 0x80, 0x67}, info, void))
}

// handleAV answers /audio/{name}.{wav,mp3} and /video/{name}.{mp4,webm}, with ?type= as
// handleImage.
func handleAV(dir string) http.HandlerFunc {
	return func(rw http.ResponseWriter, r *http.Request) {
		file := r.PathValue("file")
		dot := strings.LastIndexByte(file, '.')
		if dot <= 0 {
			http.NotFound(rw, r)
			return
		}
		f, ok := avFiles[file[dot:]]
		if !ok || (dir == "audio") != strings.HasPrefix(f.ctype, "audio/") {
			http.NotFound(rw, r)
			return
		}
		writeTyped(rw, r, f.gen(file[:dot]), f.ctype)
	}
}

// writeTyped answers b with its length and the media type ctype, or with the request's
// ?type=T instead: another media type (a mislabelled file), or "none" for no Content-Type at all
// (the client then sniffs).
func writeTyped(rw http.ResponseWriter, r *http.Request, b []byte, ctype string) {
	switch t := r.URL.Query().Get("type"); t {
	case "":
		rw.Header().Set("Content-Type", ctype)
	case "none":
		rw.Header()["Content-Type"] = nil // net/http would sniff one
	default:
		if _, _, err := mime.ParseMediaType(t); err != nil {
			http.Error(rw, "type must be a media type or none", http.StatusBadRequest)
			return
		}
		rw.Header().Set("Content-Type", t)
	}
	rw.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = rw.Write(b)
}
