package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

const leaseUID, leaseGID = 4242, 4343

// leaseTrees makes what a lease on an image leaves on the host, as overlayfs and the
// lease write it: a writable layer with a new file, a whiteout, an opaque directory, a
// hard link and a symlink, all the lease's; a workspace and a home.
func leaseTrees(t *testing.T) []Tree {
	t.Helper()
	dir := t.TempDir()
	upper, work, home := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "home")
	files := map[string]string{
		"upper/usr/local/bin/tool": "#!/bin/sh\necho installed\n",
		"upper/opt/mine":           "the lease's\n",
		"work/repo/README":         "cloned\n",
		"home/user/.profile":       "export X=1\n",
	}
	for p, body := range files {
		must(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, p), []byte(body), 0o755))
		must(t, os.Chmod(filepath.Join(dir, p), 0o755)) // whatever the umask
	}
	must(t, os.Mkdir(filepath.Join(upper, "etc"), 0o755))
	must(t, unix.Mknod(filepath.Join(upper, "etc/os-release"), unix.S_IFCHR, 0))
	must(t, unix.Setxattr(filepath.Join(upper, "opt"), opaqueXattr, []byte("y"), 0))
	must(t, os.Link(filepath.Join(upper, "usr/local/bin/tool"), filepath.Join(upper, "usr/local/bin/tool-too")))
	must(t, os.Symlink("tool", filepath.Join(upper, "usr/local/bin/alias")))
	must(t, unix.Mkfifo(filepath.Join(upper, "usr/local/pipe"), 0o600))
	for _, root := range []string{work, home, filepath.Join(upper, "usr/local"), filepath.Join(upper, "opt")} {
		must(t, filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, leaseUID, leaseGID)
		}))
	}
	return []Tree{{Dir: upper}, {Dir: work, At: SnapshotWorkspace}, {Dir: home, At: SnapshotHome}}
}

// mountRoot mounts the layers read-only as a lease's root is stacked, for the test to
// read the merged view; unmounted at cleanup.
func mountRoot(t *testing.T, layers []string) string {
	t.Helper()
	merged := t.TempDir()
	if len(layers) == 1 { // overlayfs wants two lowers without an upper
		layers = append(layers, t.TempDir())
	}
	must(t, unix.Mount("sidecar-snapshot-test", merged, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(layers, ":")))
	t.Cleanup(func() { _ = unix.Unmount(merged, unix.MNT_DETACH) })
	return merged
}

// A snapshot is the base image with the lease's writable layer on top, whiteouts and
// opaque directories kept, the lease's files root's; its workspace and home ride in the
// same layer, and CopyTree gives them to a new lease's uid. It is named once, runs new
// leases, outlives a restart, cannot be pulled, and goes when removed or aged.
func TestSnapshotOfALease(t *testing.T) {
	src, store := t.TempDir(), t.TempDir()
	writeLayout(t, src, map[string]v1.Image{"a": imageOfLayers(t, v1.Config{Env: []string{"PATH=/bin"}}, baseLayer(t), topLayer(t, "alpha"))})
	entry := Entry{"alpha", "oci-layout:" + src + ":a"}
	s := openStore(t, store, 0, entry)
	base := pullReady(t, s, "alpha")
	ctx := context.Background()

	in, err := s.Snapshot(ctx, "prepared", SnapshotSource{Base: "alpha", Lease: "L1", UID: leaseUID, GID: leaseGID, Trees: leaseTrees(t)})
	if err != nil {
		t.Fatal(err)
	}
	if in.State != StateReady || in.Snapshot == nil || in.Snapshot.Base != "alpha" || in.Snapshot.Lease != "L1" || in.Size <= base.Size || !in.Snapshot.Expires.IsZero() {
		t.Fatalf("snapshot: %+v %+v", in, in.Snapshot)
	}
	root, release, err := s.Use("prepared")
	must(t, err)
	if len(root.Layers) != 3 || root.Seed != root.Layers[0] || root.Base != "alpha" || !slices.Equal(root.Env, []string{"PATH=/bin"}) {
		t.Fatalf("root: %+v", root)
	}
	merged := mountRoot(t, root.Layers)
	for p, want := range map[string]string{"usr/local/bin/tool": "#!/bin/sh\necho installed\n", "opt/mine": "the lease's\n", "workspace/repo/README": "cloned\n"} {
		if b, err := os.ReadFile(filepath.Join(merged, p)); err != nil || string(b) != want {
			t.Errorf("%s in the snapshot's root: %q, %v", p, b, err)
		}
	}
	for _, p := range []string{"etc/os-release", "opt/new", "etc/gone"} {
		if _, err := os.Lstat(filepath.Join(merged, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s should be hidden (a whiteout, an opaque dir): %v", p, err)
		}
	}
	var a, b unix.Stat_t
	must(t, unix.Lstat(filepath.Join(root.Seed, "usr/local/bin/tool"), &a))
	must(t, unix.Lstat(filepath.Join(root.Seed, "usr/local/bin/tool-too"), &b))
	if a.Uid != 0 || a.Gid != 0 || a.Ino != b.Ino || a.Mode&0o777 != 0o755 {
		t.Errorf("the installed file in the layer: uid %d gid %d mode %o, its hard link's inode %d vs %d", a.Uid, a.Gid, a.Mode, b.Ino, a.Ino)
	}
	if l, err := os.Readlink(filepath.Join(merged, "usr/local/bin/alias")); err != nil || l != "tool" {
		t.Errorf("symlink: %q %v", l, err)
	}
	if fi, err := os.Lstat(filepath.Join(merged, "usr/local/pipe")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("fifo: %v %v", fi, err)
	}

	// A new lease's workspace and home: copies owned by its uid.
	work, home := t.TempDir(), t.TempDir()
	must(t, CopyTree(filepath.Join(root.Seed, SnapshotWorkspace), work, 5151, 5252))
	must(t, CopyTree(filepath.Join(root.Seed, SnapshotHome), home, 5151, 5252))
	for _, p := range []string{filepath.Join(work, "repo"), filepath.Join(work, "repo/README"), filepath.Join(home, "user/.profile")} {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || st.Uid != 5151 || st.Gid != 5252 {
			t.Errorf("%s: uid %d gid %d, %v", p, st.Uid, st.Gid, err)
		}
	}

	// One name, one image; a snapshot of a snapshot descends from the listed base.
	if _, err := s.Snapshot(ctx, "prepared", SnapshotSource{Base: "alpha", Trees: leaseTrees(t)}); !errors.Is(err, ErrExists) {
		t.Fatalf("a name taken: %v", err)
	}
	if _, err := s.Snapshot(ctx, "alpha", SnapshotSource{Base: "alpha", Trees: leaseTrees(t)}); !errors.Is(err, ErrExists) {
		t.Fatalf("a listed image's name: %v", err)
	}
	in2, err := s.Snapshot(ctx, "again", SnapshotSource{Base: "prepared", Lease: "L2", Trees: []Tree{{Dir: t.TempDir()}}})
	if err != nil || in2.Snapshot.Base != "alpha" {
		t.Fatalf("a snapshot of a snapshot: %+v, %v", in2, err)
	}
	if err := s.Remove("prepared"); !errors.Is(err, ErrInUse) {
		t.Fatalf("removing a snapshot in use: %v", err)
	}
	release()
	if err := s.Pull("prepared"); !errors.Is(err, ErrSnapshot) {
		t.Fatalf("pulling a snapshot: %v", err)
	}
	s.Close()

	// A restart keeps snapshots: ready, usable, listed.
	s2, err := Open(Config{Dir: store, Images: []Entry{entry}, SnapshotMaxAge: time.Hour})
	must(t, err)
	t.Cleanup(s2.Close)
	for _, n := range []string{"prepared", "again"} {
		if err := s2.Check(n); err != nil {
			t.Fatalf("snapshot %s after a restart: %v", n, err)
		}
	}
	in = mustInfo(t, s2, "prepared")
	if want := in.Snapshot.Created.Add(time.Hour); !in.Snapshot.Expires.Equal(want) {
		t.Errorf("expires %v, want %v", in.Snapshot.Expires, want)
	}
	// Aged out: removed with their own layers; the base's stay.
	s2.ExpireSnapshots(time.Now().Add(30 * time.Minute))
	if !s2.Known("prepared") {
		t.Fatal("a snapshot went before its age")
	}
	s2.ExpireSnapshots(time.Now().Add(2 * time.Hour))
	if s2.Known("prepared") || s2.Known("again") {
		t.Fatal("snapshots past SIDECAR_SNAPSHOT_MAX_AGE are still there")
	}
	if got := dirNames(t, filepath.Join(store, "layers", "sha256")); len(got) != 2 {
		t.Fatalf("layers after the snapshots went: %v; want the base's 2", got)
	}
	if got := dirNames(t, filepath.Join(store, "records")); !slices.Equal(got, []string{"alpha.json"}) {
		t.Fatalf("records: %v", got)
	}

	// A listed name that is a snapshot in the store refuses the start, naming both.
	s3 := openStore(t, store, 0, entry)
	if _, err := s3.Snapshot(ctx, "later", SnapshotSource{Base: "alpha", Trees: []Tree{{Dir: t.TempDir()}}}); err != nil {
		t.Fatal(err)
	}
	s3.Close()
	if _, err := Open(Config{Dir: store, Images: []Entry{entry, {"later", entry.Ref}}}); err == nil || !strings.Contains(err.Error(), "SIDECAR_IMAGES") {
		t.Fatalf("a listed name that is a snapshot: %v", err)
	}
}

// What a layer cannot say is refused, and the refusal leaves nothing: no image, no
// layer, no temporary directory, nothing charged.
func TestSnapshotRefusalsLeaveNothing(t *testing.T) {
	src, store := t.TempDir(), t.TempDir()
	writeLayout(t, src, map[string]v1.Image{"a": imageOfLayers(t, v1.Config{}, baseLayer(t))})
	s := openStore(t, store, 1<<20, Entry{"alpha", "oci-layout:" + src + ":a"})
	pullReady(t, s, "alpha")
	used, _ := s.Usage()

	whiteoutName := t.TempDir()
	must(t, os.WriteFile(filepath.Join(whiteoutName, ".wh.passwd"), nil, 0o644))
	redirect := t.TempDir()
	must(t, os.Mkdir(filepath.Join(redirect, "moved"), 0o755))
	must(t, unix.Setxattr(filepath.Join(redirect, "moved"), "trusted.overlay.redirect", []byte("/old"), 0))
	big := t.TempDir()
	f, err := os.Create(filepath.Join(big, "big"))
	must(t, err)
	must(t, f.Truncate(2<<20))
	must(t, f.Close())
	for name, c := range map[string]struct {
		dir  string
		want error
	}{"whiteout-name": {whiteoutName, ErrRefused}, "redirect": {redirect, ErrRefused}, "too-big": {big, ErrFull}} {
		_, err := s.Snapshot(context.Background(), name, SnapshotSource{Base: "alpha", Trees: []Tree{{Dir: c.dir}}})
		if !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
		if s.Known(name) {
			t.Errorf("%s: the refused snapshot is listed", name)
		}
	}
	if got := dirNames(t, filepath.Join(store, "tmp")); len(got) != 0 {
		t.Errorf("tmp: %v", got)
	}
	if got := dirNames(t, filepath.Join(store, "layers", "sha256")); len(got) != 1 {
		t.Errorf("layers: %v", got)
	}
	if now, _ := s.Usage(); now != used {
		t.Errorf("store usage %d after refusals, was %d", now, used)
	}
}
