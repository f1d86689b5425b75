package fsxfer

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// What a kill -9 leaves (a temporary file, a staging directory with content) goes;
// everything else, including look-alike names that are not ours, stays.
func TestSweepTemps(t *testing.T) {
	work := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(work, "a/b"), 0o755))
	must(os.WriteFile(filepath.Join(work, "a/keep.txt"), []byte("keep"), 0o644))
	must(os.WriteFile(filepath.Join(work, "a", tempPrefix+"0011"), []byte("partial"), 0o600))
	must(os.MkdirAll(filepath.Join(work, "a/b", tempPrefix+"stage/x/y"), 0o700))
	must(os.WriteFile(filepath.Join(work, "a/b", tempPrefix+"stage/x/y/f"), []byte("staged"), 0o600))
	must(os.WriteFile(filepath.Join(work, "sidecar-tmp-not-ours"), []byte("keep"), 0o644))
	must(os.Symlink("/etc", filepath.Join(work, "a", tempPrefix+"link")))

	f, err := Open(Config{Workdir: work, UID: -1, GID: -1})
	must(err)
	defer f.Close()
	n, err := f.SweepTemps(context.Background())
	must(err)
	if n != 3 {
		t.Fatalf("removed %d entries, want 3", n)
	}
	for _, gone := range []string{"a/" + tempPrefix + "0011", "a/b/" + tempPrefix + "stage", "a/" + tempPrefix + "link"} {
		if _, err := os.Lstat(filepath.Join(work, gone)); !os.IsNotExist(err) {
			t.Errorf("%s survived: %v", gone, err)
		}
	}
	for _, kept := range []string{"a/keep.txt", "a/b", "sidecar-tmp-not-ours"} {
		if _, err := os.Lstat(filepath.Join(work, kept)); err != nil {
			t.Errorf("%s was removed: %v", kept, err)
		}
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatalf("the symlink's target suffered: %v", err)
	}
}
