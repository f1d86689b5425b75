package fsxfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// repeatReader yields size bytes cycling through block, without holding them all.
type repeatReader struct {
	block []byte
	left  int64
	off   int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.left)]
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.block[r.off:])
		n += c
		r.off = (r.off + c) % len(r.block)
	}
	r.left -= int64(n)
	return n, nil
}

// BenchmarkWriteFile256MiB: go test -run X -bench WriteFile -benchtime 3x ./fsxfer
func BenchmarkWriteFile256MiB(b *testing.B) {
	const size = 256 << 20
	block := randomBytes(1<<20, 11)
	h := sha256.New()
	io.Copy(h, &repeatReader{block: block, left: size})
	sum := h.Sum(nil)
	for _, tc := range []struct {
		name string
		o    WriteOptions
	}{{"plain", WriteOptions{}}, {"sha256", WriteOptions{SHA256: sum}}} {
		b.Run(tc.name, func(b *testing.B) {
			l := newTestLease(b)
			f := openFS(b, l.config())
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := f.WriteFile(context.Background(), "big", &repeatReader{block: block, left: size}, tc.o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func smallTree(b *testing.B, dir string, n int) int64 {
	files := map[string]string{}
	var total int64
	for i := range n {
		body := string(randomBytes(100+i%2000, uint64(i)))
		files[fmt.Sprintf("d%02d/f%04d.txt", i%40, i)] = body
		total += int64(len(body))
	}
	writeTree(b, dir, files)
	return total
}

// BenchmarkWriteTar2000: a tree of 2,000 small files out as tar.
func BenchmarkWriteTar2000(b *testing.B) {
	l := newTestLease(b)
	total := smallTree(b, filepath.Join(l.work, "tree"), 2000)
	f := openFS(b, l.config())
	b.SetBytes(total)
	for b.Loop() {
		if err := f.WriteTar(context.Background(), "tree", io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExtractTar2000: the same tree in, each time into a fresh directory.
func BenchmarkExtractTar2000(b *testing.B) {
	src := newTestLease(b)
	total := smallTree(b, filepath.Join(src.work, "tree"), 2000)
	from := openFS(b, src.config())
	var archive bytes.Buffer
	if err := from.WriteTar(context.Background(), "tree", &archive); err != nil {
		b.Fatal(err)
	}
	l := newTestLease(b)
	f := openFS(b, l.config())
	b.SetBytes(total)
	i := 0
	for b.Loop() {
		dir := fmt.Sprintf("x%d", i)
		i++
		if err := f.Mkdir(dir); err != nil {
			b.Fatal(err)
		}
		if _, err := f.ExtractTar(context.Background(), dir, bytes.NewReader(archive.Bytes()), ""); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCreate2000Baseline: the same files made with a plain os.WriteFile loop, the
// floor ExtractTar2000 is measured against (creating inodes dominates both).
func BenchmarkCreate2000Baseline(b *testing.B) {
	l := newTestLease(b)
	var total int64
	bodies := make([][]byte, 2000)
	for i := range bodies {
		bodies[i] = randomBytes(100+i%2000, uint64(i))
		total += int64(len(bodies[i]))
	}
	b.SetBytes(total)
	i := 0
	for b.Loop() {
		dir := filepath.Join(l.work, fmt.Sprintf("x%d", i))
		i++
		for j, body := range bodies {
			p := filepath.Join(dir, fmt.Sprintf("d%02d/f%04d.txt", j%40, j))
			if j < 40 {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					b.Fatal(err)
				}
			}
			if err := os.WriteFile(p, body, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
}
