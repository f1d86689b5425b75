package fsxfer

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

type tarEntry struct {
	name, body, link string
	typ              byte // 0: regular file
	mode             int64
	size             int64 // >0: announce and stream this many bytes of body repeated
}

func tarBytes(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode}
		if hdr.Typeflag == 0 {
			hdr.Typeflag = tar.TypeReg
		}
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		if hdr.Typeflag == tar.TypeReg {
			hdr.Size = int64(len(e.body))
			if e.size > 0 {
				hdr.Size = e.size
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			for n := int64(0); n < hdr.Size; {
				chunk := e.body[:min(int64(len(e.body)), hdr.Size-n)]
				m, err := tw.Write([]byte(chunk))
				if err != nil {
					t.Fatal(err)
				}
				n += int64(m)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func tarOf(t testing.TB, entries ...tarEntry) io.Reader {
	return bytes.NewReader(tarBytes(t, entries...))
}

func tarNames(t testing.TB, archive string) []string {
	t.Helper()
	var names []string
	tr := tar.NewReader(strings.NewReader(archive))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
	}
}

func compress(t testing.TB, data []byte, encoding string) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.WriteCloser
	switch encoding {
	case "", "br":
		return data
	case "gzip":
		w = gzip.NewWriter(&buf)
	case "zstd":
		z, err := zstd.NewWriter(&buf)
		if err != nil {
			t.Fatal(err)
		}
		w = z
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// snapshot describes a tree fully: names, types, modes, sizes, link targets, contents.
func snapshot(t testing.TB, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %v", rel, info.Mode())
		switch {
		case info.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			fmt.Fprintf(&b, " -> %s", target)
		case info.Mode().IsRegular():
			data, _ := os.ReadFile(p)
			fmt.Fprintf(&b, " %d %x", len(data), data[:min(len(data), 16)])
			if len(data) > 16 {
				fmt.Fprintf(&b, " %x", bytes.Count(data, []byte{0}))
			}
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func makeTestTree(t testing.TB, dir string, smallFiles int) {
	t.Helper()
	files := map[string]string{
		"empty-dir/":           "",
		"ünïcødé/ファイル.txt":     "unicode",
		"links/rel":            "->../ünïcødé/ファイル.txt",
		"links/dangling":       "->nowhere",
		"links/dir":            "->../empty-dir",
		"bin/tool":             "#!/bin/sh\n",
		"sparse-ish":           string(make([]byte, 100000)) + "end",
		"with space/and'quote": "q",
		"empty-file":           "",
	}
	for i := range smallFiles {
		files[fmt.Sprintf("many/%03d/file-%d.txt", i%37, i)] = strings.Repeat("s", i%300)
	}
	deep := ""
	for i := range 60 {
		deep = filepath.Join(deep, fmt.Sprintf("level-%02d", i))
	}
	files[filepath.Join(deep, "bottom.txt")] = "bottom"
	writeTree(t, dir, files)
	if err := os.Chmod(filepath.Join(dir, "bin", "tool"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "bin", "tool"), filepath.Join(dir, "bin", "tool-hardlink")); err != nil {
		t.Fatal(err)
	}
}

func TestTarRoundTrip(t *testing.T) {
	for _, encoding := range []string{"", "gzip", "zstd"} {
		t.Run("encoding="+encoding, func(t *testing.T) {
			small := 500
			if encoding != "" {
				small = 50 // the codecs are exercised; the tree size is the plain case's job
			}
			src := newTestLease(t)
			makeTestTree(t, filepath.Join(src.work, "tree"), small)
			from := openFS(t, src.config())
			var archive bytes.Buffer
			if err := from.WriteTar(context.Background(), "tree", &archive); err != nil {
				t.Fatal(err)
			}
			dst := newTestLease(t)
			to := openFS(t, dst.config())
			if err := to.Mkdir("into"); err != nil {
				t.Fatal(err)
			}
			stats, err := to.ExtractTar(context.Background(), "into", bytes.NewReader(compress(t, archive.Bytes(), encoding)), encoding)
			if err != nil {
				t.Fatal(err)
			}
			if stats.Files != small+7 || stats.Symlinks != 3 {
				t.Errorf("stats %+v", stats)
			}
			want, got := snapshot(t, filepath.Join(src.work, "tree")), snapshot(t, filepath.Join(dst.work, "into"))
			if got != want {
				t.Fatalf("trees differ:\n--- want\n%.2000s\n--- got\n%.2000s", want, got)
			}
			var a, b syscall.Stat_t
			syscall.Stat(filepath.Join(dst.work, "into", "bin", "tool"), &a)
			syscall.Stat(filepath.Join(dst.work, "into", "bin", "tool-hardlink"), &b)
			if a.Ino != b.Ino {
				t.Error("hard link not kept")
			}
		})
	}
}

func TestExtractTarMerges(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	writeTree(t, l.work, map[string]string{"d/keep": "keep", "d/sub/old": "old", "d/replace": "before"})
	_, err := f.ExtractTar(context.Background(), "d", tarOf(t,
		tarEntry{name: "replace", body: "after"},
		tarEntry{name: "sub/", typ: tar.TypeDir, mode: 0o755},
		tarEntry{name: "sub/new", body: "new"},
		tarEntry{name: "./fresh/x", body: "x", mode: 0o6755},
		tarEntry{name: "dup", body: "first"},
		tarEntry{name: "dup", body: "second"},
	), "")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(listTree(t, filepath.Join(l.work, "d")), ","); got != "dup,fresh/,fresh/x,keep,replace,sub/,sub/new,sub/old" {
		t.Fatalf("after merge: %s", got)
	}
	for name, want := range map[string]string{"replace": "after", "keep": "keep", "dup": "second", "sub/old": "old"} {
		if got := string(readAll(t, f, "d/"+name)); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if info, _ := f.Stat("d/fresh/x"); info.Mode != 0o755 {
		t.Errorf("setuid/setgid kept: %v", info.Mode)
	}
}

// Hostile archives: each is refused with its sentinel and leaves nothing, inside or out.
func TestExtractTarHostile(t *testing.T) {
	bomb := tarEntry{name: "bomb", body: strings.Repeat("A", 1<<16), size: 8 << 20}
	zeroBomb := tarEntry{name: "zeros", body: string(make([]byte, 1<<16)), size: 8 << 20}
	mib := tarEntry{name: "mib", body: strings.Repeat("B", 1<<16), size: 1 << 20}
	for _, tc := range []struct {
		name     string
		entries  []tarEntry
		encoding string
		want     error
		prefill  int // bytes already in the workdir
	}{
		{"absolute", []tarEntry{{name: "ok", body: "x"}, {name: "/etc/evil", body: "x"}}, "", ErrOutside, 0},
		{"dotdot", []tarEntry{{name: "ok", body: "x"}, {name: "../evil", body: "x"}}, "", ErrOutside, 0},
		{"dotdot-inner", []tarEntry{{name: "a/../../evil", body: "x"}}, "", ErrOutside, 0},
		{"symlink-absolute", []tarEntry{{name: "l", typ: tar.TypeSymlink, link: "/etc/passwd"}}, "", ErrOutside, 0},
		{"symlink-out", []tarEntry{{name: "a/l", typ: tar.TypeSymlink, link: "../../../outside"}}, "", ErrOutside, 0},
		{"symlink-then-write-through", []tarEntry{{name: "l", typ: tar.TypeSymlink, link: "."}, {name: "l/../../x", body: "x"}}, "", ErrOutside, 0},
		{"hardlink-outside", []tarEntry{{name: "h", typ: tar.TypeLink, link: "../outside/secret.txt"}}, "", ErrOutside, 0},
		{"hardlink-absolute", []tarEntry{{name: "h", typ: tar.TypeLink, link: "/etc/passwd"}}, "", ErrOutside, 0},
		{"hardlink-not-in-archive", []tarEntry{{name: "h", typ: tar.TypeLink, link: "existing"}}, "", ErrOutside, 0},
		{"hardlink-to-symlink", []tarEntry{{name: "l", typ: tar.TypeSymlink, link: "x"}, {name: "h", typ: tar.TypeLink, link: "l"}}, "", ErrNotRegular, 0},
		{"hardlink-to-dir", []tarEntry{{name: "d/", typ: tar.TypeDir}, {name: "h", typ: tar.TypeLink, link: "d"}}, "", ErrNotRegular, 0},
		{"char-device", []tarEntry{{name: "null", typ: tar.TypeChar}}, "", ErrNotRegular, 0},
		{"block-device", []tarEntry{{name: "sda", typ: tar.TypeBlock}}, "", ErrNotRegular, 0},
		{"fifo", []tarEntry{{name: "fifo", typ: tar.TypeFifo}}, "", ErrNotRegular, 0},
		{"too-many", []tarEntry{{name: "1"}, {name: "2"}, {name: "3"}, {name: "4"}, {name: "5"}, {name: "6"}}, "", ErrTooLarge, 0},
		{"long-name", []tarEntry{{name: strings.Repeat("n", 300), body: "x"}}, "", ErrNameTooLong, 0},
		{"long-path", []tarEntry{{name: strings.Repeat("d/", 2100) + "f", body: "x"}}, "", ErrNameTooLong, 0},
		{"file-over-existing-dir", []tarEntry{{name: "existing-dir", body: "x"}}, "", ErrIsDir, 0},
		{"dir-over-existing-file", []tarEntry{{name: "existing/", typ: tar.TypeDir}}, "", ErrNotDir, 0},
		{"bomb-gzip", []tarEntry{{name: "ok", body: "x"}, bomb}, "gzip", ErrQuota, 0},
		{"bomb-zstd", []tarEntry{bomb}, "zstd", ErrQuota, 0},
		{"zero-bomb", []tarEntry{zeroBomb}, "gzip", ErrQuota, 0},
		{"over-quota-with-usage", []tarEntry{mib, {name: "x", body: "x"}}, "", ErrQuota, 1<<20 + 512<<10},
		{"garbage", nil, "gzip", ErrInvalid, 0},
		{"unknown-encoding", []tarEntry{{name: "x"}}, "br", ErrInvalid, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newTestLease(t)
			cfg := l.config()
			cfg.MaxArchiveEntries = 5
			cfg.QuotaBytes = 2 << 20
			writeTree(t, l.work, map[string]string{"existing": "e", "existing-dir/": ""})
			if tc.prefill > 0 {
				writeTree(t, l.work, map[string]string{"prefill": string(randomBytes(tc.prefill, 9))})
			}
			f := openFS(t, cfg)
			before := snapshot(t, l.dir)
			data := compress(t, tarBytes(t, tc.entries...), tc.encoding)
			if tc.name == "garbage" {
				data = []byte("this is not gzip")
			}
			_, err := f.ExtractTar(context.Background(), "", bytes.NewReader(data), tc.encoding)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ExtractTar = %v, want %v", err, tc.want)
			}
			if after := snapshot(t, l.dir); after != before {
				t.Fatalf("lease dir changed:\n--- before\n%s--- after\n%s", before, after)
			}
			assertOutsideUntouched(t, l)
			if u, _ := f.Usage(context.Background()); u > cfg.QuotaBytes {
				t.Errorf("usage %d after a refused archive", u)
			}
		})
	}
}

func TestExtractTarOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to another uid (CI runs as root)")
	}
	l := newTestLease(t)
	cfg := l.config()
	cfg.UID, cfg.GID = 4242, 4343
	f := openFS(t, cfg)
	_, err := f.ExtractTar(context.Background(), "", tarOf(t,
		tarEntry{name: "d/f", body: "x"}, tarEntry{name: "d/l", typ: tar.TypeSymlink, link: "f"},
		tarEntry{name: "e/", typ: tar.TypeDir}), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d", "d/f", "d/l", "e"} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(l.work, p), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != 4242 || st.Gid != 4343 {
			t.Errorf("%s owned by %d:%d", p, st.Uid, st.Gid)
		}
	}
}
