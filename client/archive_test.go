package client

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

var fixedTime = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func mustWrite(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func decodeBody(r *http.Request) (io.Reader, error) {
	switch r.Header.Get("Content-Encoding") {
	case "gzip":
		return gzip.NewReader(r.Body)
	case "zstd":
		return zstd.NewReader(r.Body)
	}
	return r.Body, nil
}

// assertSameTree compares names, types, modes, contents and link targets.
func assertSameTree(t *testing.T, a, b string) {
	t.Helper()
	describe := func(root string) map[string]string {
		m := map[string]string{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			info, _ := d.Info()
			desc := info.Mode().String()
			switch {
			case info.Mode()&fs.ModeSymlink != 0:
				target, _ := os.Readlink(p)
				desc += " -> " + target
			case info.Mode().IsRegular():
				content, _ := os.ReadFile(p)
				desc += " " + string(content)
			}
			m[rel] = desc
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	ma, mb := describe(a), describe(b)
	delete(ma, ".")
	delete(mb, ".")
	if len(ma) != len(mb) {
		t.Errorf("trees differ: %v vs %v", ma, mb)
	}
	for k, v := range ma {
		if mb[k] != v {
			t.Errorf("%s: %q vs %q", k, v, mb[k])
		}
	}
}

// hostileTar builds an archive from headers (regular files get "x" as content).
func hostileTar(t *testing.T, hdrs ...*tar.Header) io.Reader {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeReg {
			h.Size = 1
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			_, _ = tw.Write([]byte("x"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestExtractRefusesEscapes(t *testing.T) {
	reg := func(name string) *tar.Header { return &tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644} }
	tests := []struct {
		name string
		hdrs []*tar.Header
	}{
		{"dotdot", []*tar.Header{reg("../escaped")}},
		{"nested dotdot", []*tar.Header{reg("a/../../escaped")}},
		{"absolute", []*tar.Header{reg("/tmp/escaped")}},
		{"absolute symlink", []*tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc"}}},
		{"escaping symlink", []*tar.Header{{Name: "a/l", Typeflag: tar.TypeSymlink, Linkname: "../../x"}}},
		{"hardlink out", []*tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			mustWrite(t, filepath.Join(parent, "outside"), "secret", 0o600)
			dir := filepath.Join(parent, "in")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			root, err := os.OpenRoot(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			err = extractTar(root, hostileTar(t, tt.hdrs...), nil, t.Logf)
			if !errors.Is(err, ErrUnsafeArchive) {
				t.Fatalf("err = %v, want ErrUnsafeArchive", err)
			}
			entries, _ := os.ReadDir(parent)
			if len(entries) != 2 {
				t.Fatalf("something landed next to the target: %v", entries)
			}
		})
	}
}

// A symlink planted by the archive cannot carry a later entry outside: os.Root refuses
// to follow it out, and a regular entry replaces the link rather than writing through it.
func TestExtractDoesNotFollowPlantedLinks(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "in")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(parent, filepath.Join(dir, "up")); err != nil { // already there, pointing out
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	err = extractTar(root, hostileTar(t,
		&tar.Header{Name: "up/escaped", Typeflag: tar.TypeReg, Mode: 0o644},
	), nil, t.Logf)
	if err == nil {
		t.Fatal("wrote through a symlink pointing out")
	}
	if _, err := os.Stat(filepath.Join(parent, "escaped")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("file appeared outside: %v", err)
	}
	err = extractTar(root, hostileTar(t,
		&tar.Header{Name: "inner", Typeflag: tar.TypeSymlink, Linkname: "sub"},
		&tar.Header{Name: "inner", Typeflag: tar.TypeReg, Mode: 0o4755},
	), nil, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(filepath.Join(dir, "inner"))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
		t.Fatalf("inner: %v %v", fi.Mode(), err)
	}
}

// Files spread over more directories than the extractor keeps open, in an order that
// leaves and revisits each directory, land whole with the archive's mode and time, and
// replace a file already there.
func TestExtractManyDirectories(t *testing.T) {
	dir := t.TempDir()
	mustWrite(t, filepath.Join(dir, "d007", "f1"), "old content", 0o600)
	const dirs, perDir = maxOpenDirs + 36, 3
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := func(d, f int) string { return fmt.Sprintf("file %d of dir %d", f, d) }
	for f := range perDir {
		for d := range dirs {
			b := body(d, f)
			hdr := &tar.Header{Name: fmt.Sprintf("d%03d/f%d", d, f), Typeflag: tar.TypeReg, Mode: 0o666, Size: int64(len(b)), ModTime: mtime}
			if err := tw.WriteHeader(hdr); err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(tw, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := extractTar(root, &buf, nil, t.Logf); err != nil {
		t.Fatal(err)
	}
	for d := range dirs {
		for f := range perDir {
			p := filepath.Join(dir, fmt.Sprintf("d%03d/f%d", d, f))
			got, err := os.ReadFile(p)
			if err != nil || string(got) != body(d, f) {
				t.Fatalf("%s: %q, %v", p, got, err)
			}
			fi, err := os.Stat(p)
			if err != nil || fi.Mode().Perm() != 0o666 || !fi.ModTime().Equal(mtime) {
				t.Fatalf("%s: mode %v, mtime %v, %v", p, fi.Mode(), fi.ModTime(), err)
			}
		}
	}
}
