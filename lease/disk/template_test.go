package disk

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// e2fs runs an e2fsprogs tool (found beside mkfs.ext4) and returns its output.
func e2fs(t testing.TB, tool string, args ...string) (string, error) {
	t.Helper()
	mkfs, err := findMkfs()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(filepath.Dir(mkfs), tool), args...).CombinedOutput()
	return string(out), err
}

func fsUUID(t testing.TB, img string) string {
	t.Helper()
	out, err := e2fs(t, "dumpe2fs", "-h", img)
	if err != nil {
		t.Fatalf("dumpe2fs %s: %v\n%s", img, err, out)
	}
	for line := range strings.Lines(out) {
		if v, ok := strings.CutPrefix(line, "Filesystem UUID:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("dumpe2fs %s: no UUID\n%s", img, out)
	return ""
}

var groupLine = regexp.MustCompile(`^Group [0-9]+:`)

// unzeroedGroups counts the block groups whose inode table the kernel would zero.
func unzeroedGroups(t testing.TB, img string) int {
	t.Helper()
	out, err := e2fs(t, "dumpe2fs", img)
	if err != nil {
		t.Fatalf("dumpe2fs %s: %v\n%s", img, err, out)
	}
	n := 0
	for line := range strings.Lines(out) {
		if groupLine.MatchString(line) && !strings.Contains(line, "ITABLE_ZEROED") {
			n++
		}
	}
	return n
}

// prezeroes says whether mkfs has assume_storage_prezeroed (e2fsprogs 1.47 and later).
func prezeroes(t testing.TB) bool {
	out, _ := e2fs(t, "mkfs.ext4", "-V")
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(out, "mke2fs "), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("mkfs.ext4 -V: %q", out)
	}
	return major > 1 || minor >= 47
}

func fsck(t testing.TB, img string) {
	t.Helper()
	if out, err := e2fs(t, "e2fsck", "-fn", img); err != nil {
		t.Fatalf("e2fsck -fn %s: %v\n%s", img, err, out)
	}
}

func newTestTemplates(t testing.TB, root string) *templates {
	t.Helper()
	mkfs, err := findMkfs()
	if err != nil {
		t.Fatal(err)
	}
	return newTemplates(mkfs, filepath.Join(root, "templates"), slog.New(slog.DiscardHandler))
}

// Clones of one template are each a whole filesystem of their own: e2fsck finds nothing
// wrong before or after the kernel mounted and wrote them, and no two share a UUID.
func TestClonesAreWholeAndDistinct(t *testing.T) {
	needLoop(t)
	root := newRoot(t)
	tpl := newTestTemplates(t, root)
	seen := map[string]string{}
	for _, name := range []string{"a", "b", "c"} {
		img := filepath.Join(root, name+".img")
		if err := tpl.format(context.Background(), img, 64<<20); err != nil {
			t.Fatal(err)
		}
		if tpl.off != nil {
			t.Fatalf("templates off: %v", tpl.off)
		}
		fsck(t, img)
		if groups := unzeroedGroups(t, img); groups != 0 && prezeroes(t) {
			t.Fatalf("%d block groups without ITABLE_ZEROED: the kernel will zero their inode tables", groups)
		}
		uuid := fsUUID(t, img)
		if other, dup := seen[uuid]; dup {
			t.Fatalf("%s and %s share the UUID %s", name, other, uuid)
		}
		seen[uuid] = name
		dir := filepath.Join(root, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := mountImage(img, dir, true); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "f"), make([]byte, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := unmount(dir); err != nil {
			t.Fatal(err)
		}
		_ = detachImage(img)
		fsck(t, img)
		if got := fsUUID(t, img); got != uuid {
			t.Fatalf("%s: UUID %s after a mount, was %s", name, got, uuid)
		}
	}
	if tplUUID := fsUUID(t, filepath.Join(root, "templates", fmt.Sprint(64<<20)+".img")); seen[tplUUID] != "" {
		t.Fatalf("clone %s kept the template's UUID", seen[tplUUID])
	}
}

// A template whose checksums follow its UUID cannot be cloned by patching the UUID.
func TestTemplateNeedsTheChecksumSeed(t *testing.T) {
	needLoop(t)
	root := newRoot(t)
	img := filepath.Join(root, "seedless.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := e2fs(t, "mkfs.ext4", "-q", "-F", "-O", "metadata_csum,^metadata_csum_seed", img); err != nil {
		t.Fatalf("mkfs: %v\n%s", err, out)
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := readSuperblocks(f); err == nil || !strings.Contains(err.Error(), "metadata_csum_seed") {
		t.Fatalf("readSuperblocks of an image without the seed: %v, want a refusal naming metadata_csum_seed", err)
	}
}

// At most maxTemplates sizes are kept, the least recently used going first.
func TestTemplatesKeepRecentSizes(t *testing.T) {
	needLoop(t)
	root := newRoot(t)
	tpl := newTestTemplates(t, root)
	size := func(i int) int64 { return int64(16+i) << 20 }
	for i := range maxTemplates + 1 {
		if err := tpl.format(context.Background(), filepath.Join(root, "x.img"), size(i)); err != nil {
			t.Fatal(err)
		}
		if i == 1 { // the first used again: the second is now the least recent
			if err := tpl.format(context.Background(), filepath.Join(root, "x.img"), size(0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	files, _ := filepath.Glob(filepath.Join(root, "templates", "*.img"))
	if len(files) != maxTemplates || len(tpl.bySize) != maxTemplates {
		t.Fatalf("%d template files, %d known, want %d", len(files), len(tpl.bySize), maxTemplates)
	}
	if tpl.bySize[size(1)] != nil || tpl.bySize[size(0)] == nil {
		t.Fatalf("kept sizes %v: want the second size evicted, the first kept", tpl.bySize)
	}
}

// BenchmarkFormat: an image of the shipped default quota made by mkfs and by a clone.
func BenchmarkFormat(b *testing.B) {
	needLoop(b)
	root := newRoot(b)
	tpl := newTestTemplates(b, root)
	img := filepath.Join(root, "x.img")
	const size = 10 << 30
	b.Run("mkfs", func(b *testing.B) {
		for b.Loop() {
			if err := makeImage(context.Background(), tpl.mkfs, img, size, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("clone", func(b *testing.B) {
		for b.Loop() {
			if err := tpl.format(context.Background(), img, size); err != nil {
				b.Fatal(err)
			}
		}
	})
}
