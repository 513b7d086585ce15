package simworker

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"strings"
)

// kwargsBlobBase is the fixed part of the size of an image's kwargs blob.
const kwargsBlobBase = 4096

// kwargsPeriod is the period of ImageKwargsBlob's bytes: seed[i%32] ^
// byte(i*131>>3) repeats every 2048 bytes.
const kwargsPeriod = 2048

// kwargsB64Period is the shortest period of ImageKwargsBlob that is a whole
// number of base64 groups (lcm(2048, 3) bytes): the base64 encoding of a blob
// is the encoding of one such period repeated, then of the remainder.
const kwargsB64Period = 3 * kwargsPeriod

// errBadBase64 reports a base64 data URL whose payload does not decode.
var errBadBase64 = errors.New("invalid base64 payload in image data URL")

// ImageBytes returns the bytes B that stand for the image at url: the decoded
// payload of a "data:<mime>;base64,<b64>" URL, or the URL's own bytes for any
// other URL. It fails only on a base64 data URL with an invalid payload.
func ImageBytes(url string) ([]byte, error) {
	payload, ok := base64Payload(url)
	if !ok {
		return []byte(url), nil
	}
	return decodeBase64String(payload)
}

// decodeBase64String decodes payload in the standard encoding, else the unpadded one.
func decodeBase64String(payload string) ([]byte, error) {
	b, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		if b2, err2 := base64.RawStdEncoding.DecodeString(payload); err2 == nil {
			return b2, nil
		}
		return nil, errBadBase64
	}
	return b, nil
}

// base64Payload returns the payload of a "data:<mime>;base64,<b64>" URL.
func base64Payload(url string) (string, bool) {
	rest, ok := strings.CutPrefix(url, "data:")
	if !ok {
		return "", false
	}
	meta, payload, ok := strings.Cut(rest, ",")
	if !ok || !strings.HasSuffix(meta, ";base64") {
		return "", false
	}
	return payload, true
}

// ImageTokenCount returns the number of placeholder tokens of an image whose
// bytes are b: 4 + len(b) % 61.
func ImageTokenCount(b []byte) int {
	return imageTokens(len(b))
}

// imageTokens is ImageTokenCount of an image of n bytes.
func imageTokens(n int) int {
	return 4 + n%61
}

// ImageHash returns the mm_hash of an image whose bytes are b: hex SHA-256.
func ImageHash(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ImageKwargsSize returns the size in bytes of ImageKwargsBlob for an image of
// n bytes: 4096 + 3*n. It is also the size_bytes of the image's EC descriptor.
func ImageKwargsSize(n int) int {
	return kwargsBlobBase + 3*n
}

// ImageKwargsBlob returns the deterministic stand-in for the processed
// multimodal kwargs (pixel values) of an image whose bytes are b. Its size is
// ImageKwargsSize(len(b)).
func ImageKwargsBlob(b []byte) []byte {
	return kwargsBlob(sha256.Sum256(b), len(b))
}

// kwargsBlob is ImageKwargsBlob of an image of n bytes whose SHA-256 is seed.
func kwargsBlob(seed [sha256.Size]byte, n int) []byte {
	out := make([]byte, ImageKwargsSize(n))
	fillKwargs(out, seed)
	return out
}

// fillKwargs fills dst with the first len(dst) bytes of the kwargs blob of an
// image whose SHA-256 is seed: byte i is seed[i%32] ^ byte(i*131>>3). One
// period is computed, the rest is copied.
func fillKwargs(dst []byte, seed [sha256.Size]byte) {
	n := min(len(dst), kwargsPeriod)
	for i := range n {
		dst[i] = seed[i%len(seed)] ^ byte(i*131>>3)
	}
	for n < len(dst) {
		n += copy(dst[n:], dst[:n])
	}
}

// writeKwargsBase64 writes the standard base64 encoding of the kwargs blob of
// an image of n bytes whose SHA-256 is seed, encoding one period of it only.
func writeKwargsBase64(w io.Writer, seed [sha256.Size]byte, n int) error {
	size := ImageKwargsSize(n)
	period := make([]byte, min(size, kwargsB64Period))
	fillKwargs(period, seed)
	enc := []byte(base64.StdEncoding.EncodeToString(period))
	for range size / kwargsB64Period {
		if _, err := w.Write(enc); err != nil {
			return err
		}
	}
	if rest := size % kwargsB64Period; rest > 0 {
		_, err := io.WriteString(w, base64.StdEncoding.EncodeToString(period[:rest]))
		return err
	}
	return nil
}

// ImageMetadata returns the base64 mm_metadata item the render endpoints answer for an image
// whose bytes are b (vllm-project/vllm#54659: the light fields of its MultiModalKwargsItem,
// without pixel values): a small JSON object {"image_grid_thw":[1,2,2t],"size":n,"mm_hash":h},
// t being ImageTokenCount(b) (a merge size of 2 makes the grid t tokens), n len(b) and h
// ImageHash(b). The hash is the double's own field: it lets a prefill worker check that an item's
// metadata is the one rendered for its mm_hash. MediaMetadata is its form for every modality.
func ImageMetadata(b []byte) string {
	return MediaMetadata(ModalityImage, b)
}

// imageDetail says how much of each image a rendering computes.
type imageDetail int

// The image details, each including the previous ones.
const (
	imageSize   imageDetail = iota // the size of B (placeholder count)
	imageDigest                    // its SHA-256 (mm_hash, kwargs blob)
	imageData                      // B itself
)

// chatImage is one media part (an image, audio or a video) of rendered chat messages.
type chatImage struct {
	mod    string            // its modality: ModalityImage, ModalityAudio or ModalityVideo
	offset int               // index in the token ids of its first placeholder
	size   int               // len(B), B being ImageBytes(url) (input_audio: its decoded data)
	sum    [sha256.Size]byte // its digest, mediaSum of B (imageDigest and imageData)
	data   []byte            // B (imageData only)
}

// hash returns the item's mm_hash (MediaHash of B).
func (im *chatImage) hash() string { return hex.EncodeToString(im.sum[:]) }

// modality returns the item's modality (an image when unset).
func (im *chatImage) modality() string {
	if im.mod == "" {
		return ModalityImage
	}
	return im.mod
}

// tokens returns the item's number of placeholder tokens.
func (im *chatImage) tokens() int { return mediaTokens(im.modality(), im.size) }

// loadImage computes detail of the image at url (see loadMedia).
func loadImage(url string, detail imageDetail) (chatImage, error) {
	return loadMedia(ModalityImage, url, detail)
}

// loadMedia computes detail of the item of modality at url, decoding a base64 payload once, in
// chunks, without holding B unless detail is imageData.
func loadMedia(modality, url string, detail imageDetail) (chatImage, error) {
	payload, ok := base64Payload(url)
	if !ok {
		return loadBytes(modality, []byte(url), detail), nil
	}
	return loadBase64(modality, payload, detail)
}

// loadBase64 computes detail of the item of modality whose bytes are the base64 payload (an
// input_audio's data, a data: URL's payload).
func loadBase64(modality, payload string, detail imageDetail) (chatImage, error) {
	if detail == imageData || hasLineBreak(payload) {
		// Rare cases: the bytes are wanted, or line breaks (which the decoder skips) break the
		// chunking.
		b, err := decodeBase64String(payload)
		if err != nil {
			return chatImage{}, err
		}
		return loadBytes(modality, b, detail), nil
	}
	var h hash.Hash
	if detail == imageDigest {
		h = mediaHasher(modality)
	}
	n, err := decodeBase64(h, bytesOf(payload))
	if err != nil {
		return chatImage{}, err
	}
	im := chatImage{mod: modality, size: n}
	if h != nil {
		h.Sum(im.sum[:0])
	}
	return im, nil
}

// loadBytes computes detail of the item of modality whose bytes are b.
func loadBytes(modality string, b []byte, detail imageDetail) chatImage {
	im := chatImage{mod: modality, size: len(b)}
	if detail >= imageDigest {
		im.sum = mediaSum(modality, b)
	}
	if detail == imageData {
		im.data = b
	}
	return im
}

// hasLineBreak reports whether s holds a CR or LF (two vectorized scans:
// strings.ContainsAny tests one byte at a time).
func hasLineBreak(s string) bool {
	return strings.IndexByte(s, '\n') >= 0 || strings.IndexByte(s, '\r') >= 0
}

// decodeBase64 decodes payload the way ImageBytes does (the standard
// encoding, else the unpadded one), chunk by chunk, writes the bytes to w
// unless w is nil and returns their number. payload must not contain line
// breaks.
func decodeBase64(w io.Writer, payload []byte) (int, error) {
	// Every quantum but the last one decodes alike in both encodings, and
	// only the last one may hold padding. Without line breaks to skip, a
	// length that is not a multiple of four fails the standard encoding: the
	// short last quantum is then decoded unpadded.
	last := len(payload) % 4
	if last == 0 {
		last = min(len(payload), 4)
	}
	head, tail := payload[:len(payload)-last], payload[len(payload)-last:]
	if bytes.IndexByte(head, '=') >= 0 {
		return 0, errBadBase64
	}
	var buf [6 << 10]byte
	n := 0
	emit := func(enc *base64.Encoding, src []byte) error {
		k, err := enc.Decode(buf[:], src)
		if err != nil {
			return errBadBase64
		}
		n += k
		if w != nil {
			_, _ = w.Write(buf[:k])
		}
		return nil
	}
	for len(head) > 0 {
		chunk := head[:min(len(head), len(buf)/3*4)]
		if err := emit(base64.StdEncoding, chunk); err != nil {
			return 0, err
		}
		head = head[len(chunk):]
	}
	enc := base64.StdEncoding
	if len(tail) < 4 {
		enc = base64.RawStdEncoding
	}
	if err := emit(enc, tail); err != nil {
		return 0, err
	}
	return n, nil
}
