package fsxfer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRemoveTree(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	writeTree(t, outside, map[string]string{"keep.txt": "keep", "sub/also.txt": "also"})

	lease := filepath.Join(base, "lease")
	writeTree(t, lease, map[string]string{
		"work/a.txt":        "a",
		"work/empty/":       "",
		"work/dir/b.txt":    "b",
		"work/link-out":     "->" + outside,
		"work/link-file":    "->" + filepath.Join(outside, "keep.txt"),
		"work/ünïcødé/ファイル": "x",
		"tmp/":              "",
	})
	// Deep nesting: deeper than one descriptor per level would comfortably allow.
	deep := filepath.Join(lease, "work", "deep")
	p := deep
	for range 300 {
		p = filepath.Join(p, "d")
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "leaf"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A directory without write permission is still removed (the daemon is its owner or root).
	if err := os.Chmod(filepath.Join(lease, "work", "dir"), 0o500); err != nil {
		t.Fatal(err)
	}

	if err := RemoveTree(lease); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(lease); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lease dir still there: %v", err)
	}
	if got := listTree(t, outside); strings.Join(got, ",") != "keep.txt,sub/,sub/also.txt" {
		t.Fatalf("outside tree changed: %v", got)
	}
	// Removing again is fine: releasing twice must not fail.
	if err := RemoveTree(lease); err != nil {
		t.Fatalf("second removal: %v", err)
	}
}

func TestRemoveTreeSymlinkIsNotFollowed(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "target")
	writeTree(t, target, map[string]string{"f": "data"})
	link := filepath.Join(base, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTree(link); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("link still there: %v", err)
	}
	if got := listTree(t, target); len(got) != 1 {
		t.Fatalf("target changed: %v", got)
	}
}

func TestRemoveTreeRejectsBadPaths(t *testing.T) {
	for _, p := range []string{"", "relative/dir", "/", "/tmp/../tmp/x", "/tmp/x/"} {
		if err := RemoveTree(p); !errors.Is(err, ErrInvalid) {
			t.Errorf("RemoveTree(%q) = %v, want ErrInvalid", p, err)
		}
	}
}

func TestRemoveTreeRefusesBindMount(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "mounted-src")
	writeTree(t, src, map[string]string{"precious.txt": "precious", "deep/x": "x"})
	lease := filepath.Join(base, "lease")
	writeTree(t, lease, map[string]string{"work/a": "a", "work/mnt/": ""})
	bindMount(t, src, filepath.Join(lease, "work", "mnt"))

	err := RemoveTree(lease)
	if !errors.Is(err, ErrMountPoint) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("RemoveTree = %v, want ErrMountPoint", err)
	}
	// Refused before anything went: the whole tree is still there, mount included.
	if got := strings.Join(listTree(t, lease), ","); got != "work/,work/a,work/mnt/,work/mnt/deep/,work/mnt/deep/x,work/mnt/precious.txt" {
		t.Fatalf("tree after refusal: %s", got)
	}
}

// The walk itself refuses to enter a mount even when the mountinfo check is bypassed
// (a mount appearing after it, or one under a path the daemon cannot name).
func TestRemoveAtStopsAtBindMount(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "mounted-src")
	writeTree(t, src, map[string]string{"precious.txt": "precious"})
	srcFile := filepath.Join(base, "mounted-file")
	writeTree(t, base, map[string]string{"mounted-file": "file content"})
	for _, tc := range []struct{ name, mountAt, src string }{
		{"dir", "mnt/", src},
		{"file", "mntfile", srcFile},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lease := filepath.Join(base, "lease-"+tc.name)
			writeTree(t, lease, map[string]string{"a/b": "b", tc.mountAt: ""})
			bindMount(t, tc.src, filepath.Join(lease, strings.TrimSuffix(tc.mountAt, "/")))
			parent, err := unix.Open(base, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(parent)
			if err := removeAt(parent, filepath.Base(lease)); !errors.Is(err, ErrMountPoint) {
				t.Fatalf("removeAt = %v, want ErrMountPoint", err)
			}
			if b, err := os.ReadFile(filepath.Join(base, "mounted-file")); err != nil || string(b) != "file content" {
				t.Fatalf("mounted file: %q %v", b, err)
			}
			if b, err := os.ReadFile(filepath.Join(src, "precious.txt")); err != nil || string(b) != "precious" {
				t.Fatalf("mounted dir content: %q %v", b, err)
			}
		})
	}
}

// A mount anywhere in the tree, on a directory or a file, at any depth, or on the tree's
// root itself, makes RemoveTree refuse before removing anything; with the tree read for
// mount IDs and, as on kernels without them, with mountinfo.
func TestRemoveTreeRefusesMountsAnywhere(t *testing.T) {
	base := t.TempDir()
	srcDir := filepath.Join(base, "src-dir")
	writeTree(t, srcDir, map[string]string{"precious.txt": "precious"})
	srcFile := filepath.Join(base, "src-file")
	writeTree(t, base, map[string]string{"src-file": "file content"})
	for _, how := range []struct {
		name     string
		mountIDs func() bool
	}{{"statx", statxMountIDs}, {"mountinfo", func() bool { return false }}} {
		for _, tc := range []struct{ name, mountAt, src string }{
			{"deep-dir", "z/y/x/w/mnt/", srcDir},
			{"file", "a/b/mntfile", srcFile},
			{"root", "", srcDir},
		} {
			t.Run(how.name+"/"+tc.name, func(t *testing.T) {
				old := statxMountIDs
				statxMountIDs = how.mountIDs
				t.Cleanup(func() { statxMountIDs = old })
				lease := filepath.Join(base, "lease-"+how.name+"-"+tc.name)
				tree := map[string]string{"a/b/c": "c", "a/d/": "", "top": "t"}
				if tc.mountAt != "" {
					tree[tc.mountAt] = ""
				}
				writeTree(t, lease, tree)
				bindMount(t, tc.src, filepath.Join(lease, strings.TrimSuffix(tc.mountAt, "/")))
				before := strings.Join(listTree(t, lease), ",")

				if err := RemoveTree(lease); !errors.Is(err, ErrMountPoint) {
					t.Fatalf("RemoveTree = %v, want ErrMountPoint", err)
				}
				if got := strings.Join(listTree(t, lease), ","); got != before {
					t.Fatalf("tree after refusal: %s, want %s", got, before)
				}
			})
		}
	}
}

// The mount check climbs back out of every subdirectory it enters: in a wide tree it
// finds a mount below any one of many siblings, and passes the same tree without it.
func TestRemoveTreeMountCheckVisitsEverySibling(t *testing.T) {
	base := t.TempDir()
	src := filepath.Join(base, "src")
	writeTree(t, src, map[string]string{"precious.txt": "precious"})
	for _, mountIn := range []int{-1, 0, 17, 49} {
		t.Run(fmt.Sprint("mount-in-", mountIn), func(t *testing.T) {
			lease := filepath.Join(base, fmt.Sprint("lease", mountIn))
			tree := map[string]string{}
			for i := range 50 {
				tree[fmt.Sprintf("wide/d%02d/f", i)] = "x"
				tree[fmt.Sprintf("wide/d%02d/e/g/", i)] = ""
			}
			writeTree(t, lease, tree)
			if mountIn < 0 {
				if err := RemoveTree(lease); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Lstat(lease); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("lease dir still there: %v", err)
				}
				return
			}
			bindMount(t, src, filepath.Join(lease, fmt.Sprintf("wide/d%02d/e/g", mountIn)))
			err := RemoveTree(lease)
			if want := fmt.Sprintf("wide/d%02d/e/g", mountIn); !errors.Is(err, ErrMountPoint) || !strings.Contains(err.Error(), want) {
				t.Fatalf("RemoveTree = %v, want ErrMountPoint naming %s", err, want)
			}
			if got := len(listTree(t, lease)); got != 50*4+1+1 {
				t.Fatalf("tree after refusal has %d entries, want all %d", got, 50*4+1+1)
			}
		})
	}
}
