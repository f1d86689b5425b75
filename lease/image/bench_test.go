package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// benchImageMiB is the benchmark image's size: SIDECAR_BENCH_IMAGE_MIB, default 128 (the
// issue's row is 512).
func benchImageMiB(b *testing.B) int {
	mib := 128
	if v := os.Getenv("SIDECAR_BENCH_IMAGE_MIB"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("SIDECAR_BENCH_IMAGE_MIB=%q: want a size in MiB", v)
		}
		mib = n
	}
	return mib
}

// benchLayer is a layer of about mib MiB shaped like a distribution's: many small files
// (4 KiB), some of 256 KiB, a few of 8 MiB, in directories of 100, half of each file
// random and half text, so that it compresses about as images do.
func benchLayer(b *testing.B, seed uint64, mib int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	sizes := []int{4 << 10, 256 << 10, 8 << 20}
	share := []int{30, 40, 30} // percent of the bytes in each size
	n := 0
	for i, size := range sizes {
		for left := mib << 20 * share[i] / 100; left > 0; left -= size {
			body := make([]byte, size)
			for j := range body[:size/2] {
				body[j] = byte(r.Uint32())
			}
			copy(body[size/2:], bytes.Repeat([]byte("lorem ipsum dolor sit amet\n"), size/2/27+1))
			dir := fmt.Sprintf("usr/share/d%d/", n/100)
			if n%100 == 0 {
				if err := tw.WriteHeader(&tar.Header{Name: dir, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(1700000000, 0)}); err != nil {
					b.Fatal(err)
				}
			}
			h := &tar.Header{Name: dir + "f" + strconv.Itoa(n), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(size), ModTime: time.Unix(1700000000, 0)}
			if err := tw.WriteHeader(h); err != nil {
				b.Fatal(err)
			}
			if _, err := tw.Write(body); err != nil {
				b.Fatal(err)
			}
			n++
		}
	}
	if err := tw.Close(); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkPullArchive is the first pull of an image from an OCI archive (gzip layers, as
// registries serve them): verified by digest, unpacked into a new store and synced, next
// to `tar -xzf` of the same layer blobs into a new directory on the same disk followed by
// `sync -f`, interleaved. Read "pull/tar" (a rate ratio: 1 is tar's speed).
func BenchmarkPullArchive(b *testing.B) {
	mib := benchImageMiB(b)
	img := imageOfLayers(b, v1.Config{}, benchLayer(b, 1, mib/2), benchLayer(b, 2, mib/4), benchLayer(b, 3, mib/4))
	work, err := os.MkdirTemp("/var/tmp", "sidecar-bench-pull-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(work) // no mount point under it
	archive := filepath.Join(work, "img.oci.tar")
	writeOCIArchive(b, archive, img)
	layers, err := img.Layers()
	if err != nil {
		b.Fatal(err)
	}
	var blobs []string
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			b.Fatal(err)
		}
		blobs = append(blobs, filepath.Join(work, "layout", "blobs", d.Algorithm, d.Hex))
	}
	writeLayout(b, filepath.Join(work, "layout"), map[string]v1.Image{"latest": img})

	var pull, untar time.Duration
	for iter := 0; b.Loop(); iter++ {
		store, dest := filepath.Join(work, "store"), filepath.Join(work, "untar")
		// Each iteration starts with the other contender: neither always gets the page
		// cache the other warmed.
		for k := range 2 {
			start := time.Now()
			if (iter+k)%2 == 0 {
				s := openStore(b, store, 4*int64(mib)<<20, Entry{"img", "oci-archive:" + archive})
				pullReady(b, s, "img")
				pull += time.Since(start)
				s.Close()
			} else {
				must(b, os.Mkdir(dest, 0o755))
				for _, blob := range blobs {
					if out, err := exec.Command("tar", "-xzf", blob, "-C", dest).CombinedOutput(); err != nil {
						b.Fatalf("tar: %v\n%s", err, out)
					}
				}
				if out, err := exec.Command("sync", "-f", dest).CombinedOutput(); err != nil {
					b.Fatalf("sync: %v\n%s", err, out)
				}
				untar += time.Since(start)
			}
		}
		must(b, os.RemoveAll(store))
		must(b, os.RemoveAll(dest))
	}
	n := float64(b.N)
	b.ReportMetric(float64(mib)/(pull.Seconds()/n), "pull-MiB/s")
	b.ReportMetric(float64(mib)/(untar.Seconds()/n), "tar-MiB/s")
	b.ReportMetric(untar.Seconds()/pull.Seconds(), "pull/tar")
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
