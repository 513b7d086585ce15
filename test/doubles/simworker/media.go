package simworker

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
)

// The modalities of multimodal items, as vLLM names them in features (mm_hashes.image, ...).
const (
	ModalityImage = "image"
	ModalityAudio = "audio"
	ModalityVideo = "video"
)

// modalityOrder is the order features list the modalities in: encoding/json's, which sorts map
// keys.
var modalityOrder = []string{ModalityAudio, ModalityImage, ModalityVideo}

// mediaParts maps the chat content-part types that carry media to their modality. input_audio
// carries {"data": <base64>, "format": ...}; the others {"url": ...} or a bare URL string.
var mediaParts = map[string]string{
	"image_url":   ModalityImage,
	"audio_url":   ModalityAudio,
	"input_audio": ModalityAudio,
	"video_url":   ModalityVideo,
}

// MediaTokenID returns the placeholder token id of a modality: ImageTokenID, AudioTokenID or
// VideoTokenID (ImageTokenID for an unknown one).
func MediaTokenID(modality string) int {
	switch modality {
	case ModalityAudio:
		return AudioTokenID
	case ModalityVideo:
		return VideoTokenID
	}
	return ImageTokenID
}

// isPlaceholder reports whether id is a media placeholder token.
func isPlaceholder(id int) bool {
	return id == ImageTokenID || id == AudioTokenID || id == VideoTokenID
}

// MediaTokenCount returns the number of placeholder tokens of an item of modality whose bytes
// are b: 4 + len(b) % 61 for an image (ImageTokenCount), 3 + len(b) % 37 for audio and
// 8 + len(b) % 53 for a video.
func MediaTokenCount(modality string, b []byte) int {
	return mediaTokens(modality, len(b))
}

// mediaTokens is MediaTokenCount of an item of n bytes.
func mediaTokens(modality string, n int) int {
	switch modality {
	case ModalityAudio:
		return 3 + n%37
	case ModalityVideo:
		return 8 + n%53
	}
	return imageTokens(n)
}

// mediaHasher returns the SHA-256 whose sum is an item's digest: of its bytes alone for an image
// (so an image's mm_hash stays ImageHash), of the modality's name and a NUL byte before them for
// the others, so that the same bytes sent as audio and as video are two items, as in vLLM, whose
// multimodal hash covers the modality.
func mediaHasher(modality string) hash.Hash {
	h := sha256.New()
	if modality != ModalityImage {
		_, _ = h.Write(append([]byte(modality), 0))
	}
	return h
}

// mediaSum is the digest of an item of modality whose bytes are b (see mediaHasher).
func mediaSum(modality string, b []byte) (sum [sha256.Size]byte) {
	h := mediaHasher(modality)
	_, _ = h.Write(b)
	h.Sum(sum[:0])
	return sum
}

// MediaHash returns the mm_hash of an item of modality whose bytes are b: hex SHA-256 of b for
// an image (ImageHash), of the modality's name, a NUL byte and b for audio and video.
func MediaHash(modality string, b []byte) string {
	sum := mediaSum(modality, b)
	return hex.EncodeToString(sum[:])
}

// MediaKwargsBlob returns the stand-in for the processed inputs (kwargs_data) of an item of
// modality whose bytes are b, of ImageKwargsSize(len(b)) bytes: also the size_bytes of its EC
// descriptor.
func MediaKwargsBlob(modality string, b []byte) []byte {
	return kwargsBlob(mediaSum(modality, b), len(b))
}

// MediaMetadata returns the base64 mm_metadata item the render endpoints answer for an item of
// modality whose bytes are b: ImageMetadata for an image; for a video
// {"video_grid_thw":[1,2,2t],"size":n,"mm_hash":h}, for audio
// {"audio_feature_lengths":[4t],"size":n,"mm_hash":h}, t being MediaTokenCount(modality, b), n
// len(b) and h MediaHash(modality, b).
func MediaMetadata(modality string, b []byte) string {
	return mediaMetadataBase64(modality, mediaSum(modality, b), len(b))
}

// mediaMetadataBase64 is MediaMetadata of an item of n bytes whose digest is sum.
func mediaMetadataBase64(modality string, sum [sha256.Size]byte, n int) string {
	t, h := mediaTokens(modality, n), hex.EncodeToString(sum[:])
	var js []byte
	switch modality {
	case ModalityAudio:
		js = fmt.Appendf(nil, `{"audio_feature_lengths":[%d],"size":%d,"mm_hash":%q}`, 4*t, n, h)
	case ModalityVideo:
		js = fmt.Appendf(nil, `{"video_grid_thw":[1,2,%d],"size":%d,"mm_hash":%q}`, 2*t, n, h)
	default:
		js = fmt.Appendf(nil, `{"image_grid_thw":[1,2,%d],"size":%d,"mm_hash":%q}`, 2*t, n, h)
	}
	return base64.StdEncoding.EncodeToString(js)
}

// mediaMeta is a decoded MediaMetadata item.
type mediaMeta struct {
	GridTHW      []int  `json:"image_grid_thw"`
	VideoGridTHW []int  `json:"video_grid_thw"`
	AudioLengths []int  `json:"audio_feature_lengths"`
	Size         int    `json:"size"`
	Hash         string `json:"mm_hash"`
}

// metadataFields names the light fields of each modality's metadata, for messages.
var metadataFields = map[string]string{
	ModalityImage: "image_grid_thw",
	ModalityVideo: "video_grid_thw",
	ModalityAudio: "audio_feature_lengths",
}

// light returns the item's light fields of modality (see metadataFields).
func (m *mediaMeta) light(modality string) []int {
	switch modality {
	case ModalityAudio:
		return m.AudioLengths
	case ModalityVideo:
		return m.VideoGridTHW
	}
	return m.GridTHW
}

// tokens is the number of placeholder tokens the item's light fields stand for (a merge size of
// 2 for grids, a downsampling of 4 for audio features), -1 when they are malformed.
func (m *mediaMeta) tokens(modality string) int {
	v := m.light(modality)
	switch {
	case modality == ModalityAudio && len(v) == 1:
		return v[0] / 4
	case modality != ModalityAudio && len(v) == 3:
		return v[0] * v[1] * v[2] / 4
	}
	return -1
}

// parseMediaMetadata decodes a MediaMetadata item of modality and checks that it describes the
// item of mm_hash hash with length placeholder tokens (length < 0: not checked).
func parseMediaMetadata(modality, item, hash string, length int) (*mediaMeta, error) {
	raw, err := base64.StdEncoding.DecodeString(item)
	if err != nil {
		return nil, errors.New("is not base64")
	}
	var m mediaMeta
	if err := json.Unmarshal(raw, &m); err != nil || m.tokens(modality) < 0 || m.Size < 0 {
		return nil, fmt.Errorf("is not an item the render service produced ({%s, size, mm_hash})", metadataFields[modality])
	}
	field := metadataFields[modality]
	switch t := m.tokens(modality); {
	case m.Hash != hash:
		return nil, fmt.Errorf("was rendered for mm_hash %s, not %s", m.Hash, hash)
	case t != mediaTokens(modality, m.Size):
		return nil, fmt.Errorf("%s %v does not match a %d-byte %s", field, m.light(modality), m.Size, modality)
	case length >= 0 && t != length:
		return nil, fmt.Errorf("%s %v stands for %d tokens, the placeholder has %d", field, m.light(modality), t, length)
	}
	return &m, nil
}
