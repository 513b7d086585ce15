package simworker

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"math/rand/v2"
	"strings"
	"testing"
)

// randomBytes returns n pseudo-random bytes.
func randomBytes(n int) []byte {
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestLoadImageMatchesImageBytes checks that chunked decoding gives exactly
// what ImageBytes gives (bytes, or failure) for every detail.
func TestLoadImageMatchesImageBytes(t *testing.T) {
	big := randomBytes(100_000) // many decoding chunks
	b64 := base64.StdEncoding.EncodeToString(big)
	tests := []struct {
		name string
		url  string
	}{
		{"empty payload", "data:image/png;base64,"},
		{"padded 1", "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("a"))},
		{"padded 2", "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("ab"))},
		{"no padding needed", "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("abc"))},
		{"unpadded 2", "data:image/png;base64," + base64.RawStdEncoding.EncodeToString([]byte("ab"))},
		{"unpadded 1", "data:image/png;base64," + base64.RawStdEncoding.EncodeToString([]byte("a"))},
		{"big", "data:image/jpeg;base64," + b64},
		{"big unpadded", "data:image/jpeg;base64," + base64.RawStdEncoding.EncodeToString(big[:99_999])},
		{"line breaks", "data:image/jpeg;base64," + b64[:76] + "\r\n" + b64[76:152] + "\n" + b64[152:]},
		{"non-zero trailing bits", "data:image/png;base64,AB=="},
		{"single char", "data:image/png;base64,A"},
		{"padding inside", "data:image/png;base64,AA==AAAA"},
		{"padding inside a later chunk", "data:image/png;base64," + b64[:40000] + "AA==" + b64[40004:]},
		{"padding ending a chunk", "data:image/png;base64," + b64[:8188] + "AA==" + b64[8192:]},
		{"bad padding", "data:image/png;base64,AAA=A"},
		{"unpadded with padding", "data:image/png;base64,AA="},
		{"too much padding", "data:image/png;base64,A==="},
		{"invalid char", "data:image/png;base64,AA*A"},
		{"invalid char in a later chunk", "data:image/png;base64," + b64[:50001] + "!" + b64[50002:]},
		{"space", "data:image/png;base64,AA AA"},
		{"http", "http://example.com/cat.png"},
		{"not base64", "data:text/plain,hello"},
		{"no comma", "data:image/png;base64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, wantErr := ImageBytes(tt.url)
			for _, detail := range []imageDetail{imageSize, imageDigest, imageData} {
				im, err := loadImage(tt.url, detail)
				if (err != nil) != (wantErr != nil) {
					t.Fatalf("detail %d: err = %v, want %v", detail, err, wantErr)
				}
				if err != nil {
					continue
				}
				if im.size != len(want) {
					t.Errorf("detail %d: size %d, want %d", detail, im.size, len(want))
				}
				if detail >= imageDigest && im.sum != sha256.Sum256(want) {
					t.Errorf("detail %d: wrong digest", detail)
				}
				if detail == imageData && !bytes.Equal(im.data, want) {
					t.Errorf("detail %d: wrong bytes", detail)
				}
			}
		})
	}
}

func TestKwargsBlob(t *testing.T) {
	// The definition the blob must keep: byte i is seed[i%32] ^ byte(i*131>>3).
	reference := func(img []byte) []byte {
		seed := sha256.Sum256(img)
		out := make([]byte, ImageKwargsSize(len(img)))
		for i := range out {
			out[i] = seed[i%len(seed)] ^ byte(i*131>>3)
		}
		return out
	}
	for _, n := range []int{0, 1, 2, 3, 681, 682, 683, 2048, 10_000, 100_001} {
		img := randomBytes(n)
		want := reference(img)
		if got := ImageKwargsBlob(img); !bytes.Equal(got, want) {
			t.Errorf("ImageKwargsBlob(%d bytes) differs from its definition", n)
		}
		var enc strings.Builder
		if err := writeKwargsBase64(&enc, sha256.Sum256(img), n); err != nil {
			t.Fatal(err)
		}
		if enc.String() != base64.StdEncoding.EncodeToString(want) {
			t.Errorf("writeKwargsBase64(%d bytes) is not the base64 of the blob", n)
		}
	}
}
