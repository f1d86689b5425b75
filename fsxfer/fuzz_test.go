package fsxfer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzResolve: a path either resolves to something inside the workdir or is refused;
// nothing outside is ever described or read. Seeds in testdata/fuzz/FuzzResolve.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{"", ".", "a/b", "..", "/", "a/../..", "etc/passwd", "up/secret.txt"} {
		f.Add(s)
	}
	l := newTestLease(f)
	writeTree(f, l.work, map[string]string{
		"etc": "->/etc", "up": "->../../outside", "in/up": "->../up", "inside": "->in", "in/f": "inside",
	})
	fsys := openFS(f, l.config())
	f.Fuzz(func(t *testing.T, p string) {
		rel, err := cleanPath(p, DefaultMaxNameBytes)
		if err == nil {
			if strings.HasPrefix(rel, "/") || strings.Contains(rel, "\x00") || len(rel) > DefaultMaxNameBytes {
				t.Fatalf("cleanPath(%q) = %q", p, rel)
			}
			for e := range strings.SplitSeq(rel, "/") {
				if e == ".." || e == "" || (e == "." && rel != ".") {
					t.Fatalf("cleanPath(%q) = %q has element %q", p, rel, e)
				}
			}
			if again, err := cleanPath(rel, DefaultMaxNameBytes); err != nil || again != rel {
				t.Fatalf("cleanPath not idempotent: %q → %q → %q, %v", p, rel, again, err)
			}
		} else if !errors.Is(err, ErrOutside) && !errors.Is(err, ErrNameTooLong) {
			t.Fatalf("cleanPath(%q): unexpected error %v", p, err)
		}
		if h, err := fsys.Open(p); err == nil {
			b, _ := io.ReadAll(h)
			h.Close()
			if string(b) == "secret" {
				t.Fatalf("Open(%q) read a file outside the workdir", p)
			}
		}
		if infos, err := fsys.List(p); err == nil {
			for _, i := range infos {
				if i.Name == "secret.txt" {
					t.Fatalf("List(%q) listed the outside directory", p)
				}
			}
		}
	})
}

// FuzzExtractTar: whatever the bytes, extraction writes nothing outside the workdir,
// and a refused archive leaves nothing behind. Seeds in testdata/fuzz/FuzzExtractTar.
func FuzzExtractTar(f *testing.F) {
	f.Add(tarBytes(f, tarEntry{name: "a/b", body: "x"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		l := newTestLease(t)
		cfg := l.config()
		cfg.MaxArchiveEntries = 64
		cfg.QuotaBytes = 4 << 20
		fsys := openFS(t, cfg)
		writeTree(t, l.work, map[string]string{"existing": "e"})
		before := snapshot(t, l.dir)
		_, err := fsys.ExtractTar(context.Background(), "", bytes.NewReader(data), "")
		assertOutsideUntouched(t, l)
		after := snapshot(t, l.dir)
		if err != nil && after != before {
			t.Fatalf("refused archive (%v) left changes:\n%s", err, after)
		}
		if strings.Contains(after, tempPrefix) {
			t.Fatalf("staging left behind:\n%s", after)
		}
	})
}
