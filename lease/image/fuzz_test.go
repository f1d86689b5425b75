package image

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzUnpack feeds arbitrary tar streams to the unpacker: it never panics, never
// writes outside its directory (a sibling directory stays empty, whatever the names,
// symlinks and hard links say), and never charges more than its budget.
func FuzzUnpack(f *testing.F) {
	seed := func(entries ...tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			_ = tw.WriteHeader(&h)
			if h.Typeflag == tar.TypeReg {
				_, _ = tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		_ = tw.Close()
		return buf.Bytes()
	}
	f.Add(seed(tar.Header{Name: "a/b", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644}))
	f.Add(seed(tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../outside"}, tar.Header{Name: "l/x", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(seed(tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}, tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "l/etc/passwd"}))
	f.Add(seed(tar.Header{Name: "../outside/x", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(seed(tar.Header{Name: "d/.wh..wh..opq", Typeflag: tar.TypeReg}, tar.Header{Name: "d/.wh.x", Typeflag: tar.TypeReg}))
	f.Add(seed(tar.Header{Name: "f", Typeflag: tar.TypeReg, Size: 2}, tar.Header{Name: "f", Typeflag: tar.TypeDir, Mode: 0o4777}, tar.Header{Name: "f/g", Typeflag: tar.TypeLink, Linkname: "f"}))
	// Files in a directory that a later entry replaces (the unpacker keeps a handle on the
	// directory of consecutive files).
	f.Add(seed(tar.Header{Name: "a/f", Typeflag: tar.TypeReg, Size: 1}, tar.Header{Name: "a", Typeflag: tar.TypeReg, Size: 1}, tar.Header{Name: "a/g", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(seed(tar.Header{Name: "a/f", Typeflag: tar.TypeReg, Size: 1}, tar.Header{Name: "a", Typeflag: tar.TypeSymlink, Linkname: "../outside"}, tar.Header{Name: "a/g", Typeflag: tar.TypeReg, Size: 1}))
	f.Add(seed(tar.Header{Name: "a/b/f", Typeflag: tar.TypeReg, Size: 1}, tar.Header{Name: "a/b", Typeflag: tar.TypeReg, Size: 1}, tar.Header{Name: "a/c", Typeflag: tar.TypeReg, Size: 1}))
	f.Fuzz(func(t *testing.T, stream []byte) {
		base := t.TempDir()
		dir, outside := filepath.Join(base, "layer"), filepath.Join(base, "outside")
		for _, d := range []string{dir, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		const budget = 1 << 20
		var charged int64
		charge := func(n int64) error {
			if charged+n > budget {
				return ErrFull
			}
			charged += n
			return nil
		}
		_ = unpack(bytes.NewReader(stream), dir, charge)
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("the unpacker wrote outside its directory: %v", ents)
		}
		if charged > budget {
			t.Fatalf("charged %d over the budget %d", charged, budget)
		}
	})
}
