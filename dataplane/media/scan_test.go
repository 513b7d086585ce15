package media

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"testing"
)

// mayNameURLRef is mayNameURL's definition: the three searches it replaces.
func mayNameURLRef(data []byte) bool {
	return bytes.Contains(data, []byte(":/")) || bytes.Contains(data, []byte(`:\`)) || bytes.Contains(data, []byte(`\u`))
}

// TestMayNameURL: the vector scan agrees with the three searches on short random bodies over
// the bytes that matter, and on long quiet bodies with each spelling at every offset around the
// 32- and 64-byte blocks (and cut in two by the end of the body).
func TestMayNameURL(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	alphabet := []byte(`:/\ua"`)
	for range 20000 {
		b := make([]byte, rng.IntN(200))
		for i := range b {
			if rng.IntN(4) == 0 {
				b[i] = alphabet[rng.IntN(len(alphabet))]
			} else {
				b[i] = 'x'
			}
		}
		if got, want := mayNameURL(b), mayNameURLRef(b); got != want {
			t.Fatalf("mayNameURL(%q) = %v, want %v", b, got, want)
		}
	}
	for _, n := range []int{31, 32, 33, 63, 64, 65, 200, 4096} {
		for _, spelling := range []string{":/", `:\`, `\u`, ":x", `\n`, ":", `\`} {
			for at := max(0, n-130); at <= n; at++ {
				b := bytes.Repeat([]byte("A"), n)
				copy(b[at:], spelling)
				if got, want := mayNameURL(b), mayNameURLRef(b); got != want {
					t.Fatalf("n=%d %q at %d: mayNameURL = %v, want %v", n, spelling, at, got, want)
				}
			}
		}
	}
}

// BenchmarkRefuseRemote is the check a pipeline without a media guard runs on every request
// (the benchmark bodies: a ~1 MiB inline image, 256 KiB of text).
func BenchmarkRefuseRemote(b *testing.B) {
	img := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xff, 0xd8, 0xff}, (1<<20)*3/4/3))
	bodies := map[string][]byte{
		"1MiB-image":  fmt.Appendf(nil, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,%s"}}]}],"max_tokens":16}`, img),
		"256KiB-text": fmt.Appendf(nil, `{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":16}`, bytes.Repeat([]byte("lorem ipsum "), 256<<10/12)),
	}
	for _, name := range []string{"1MiB-image", "256KiB-text"} {
		body := bodies[name]
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := RefuseRemote(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
