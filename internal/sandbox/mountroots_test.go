package sandbox

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// mountRootsDir is a fresh directory under /var/tmp, removed (never through a mount) at
// the end of t.
func mountRootsDir(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: bind mounts; CI runs as root")
	}
	dir, err := os.MkdirTemp("/var/tmp", "sidecar-roots-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, m := range mountsAt(t, dir, true) {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Error(err)
		}
	})
	return dir
}

// mountsAt lists the mount points at dir or (with under) below it.
func mountsAt(t *testing.T, dir string, under bool) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		if under || m.Mountpoint == dir {
			out = append(out, m.Mountpoint)
		}
	}
	slices.Reverse(out) // innermost first, for unmounting
	return out
}

func isMountPoint(t *testing.T, dir string) bool { return len(mountsAt(t, dir, false)) > 0 }

func mountTmpfs(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
}

// A plain directory is bound on itself and unbound by the run that finds it empty, even
// when an earlier run bound it and left leases under it.
func TestMountRootsBindAndUnbind(t *testing.T) {
	base := mountRootsDir(t)
	root, marker := filepath.Join(base, "state"), filepath.Join(base, "marker")
	if err := os.MkdirAll(filepath.Join(root, "leases"), 0o700); err != nil {
		t.Fatal(err)
	}
	r, err := BindMountRoots([]string{root, filepath.Join(root, "leases")}, marker, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Dirs(); !slices.Equal(got, []string{root}) {
		t.Fatalf("Dirs = %q, want only the outer %s", got, root)
	}
	if !isMountPoint(t, root) {
		t.Fatalf("%s is no mount point after BindMountRoots", root)
	}
	if b, _ := os.ReadFile(marker); string(b) != root+"\n" {
		t.Fatalf("marker says %q", b)
	}
	os.WriteFile(filepath.Join(root, "journal"), []byte("kept"), 0o600)

	// A lease left mounted (leases survive a restart): the root stays, and so does the marker.
	lease := filepath.Join(root, "leases", "l1")
	mountTmpfs(t, lease)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if !isMountPoint(t, root) {
		t.Fatal("Close unbound a root with a lease mounted under it")
	}

	// The next run adopts it as a sidecar's, and unbinds it once the lease is gone.
	r2, err := BindMountRoots([]string{root}, marker, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if got := mountsAt(t, root, false); len(got) != 1 {
		t.Fatalf("the second run bound %s again: %d mounts there", root, len(got))
	}
	if err := unix.Unmount(lease, 0); err != nil {
		t.Fatal(err)
	}
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	if isMountPoint(t, root) {
		t.Fatal("Close left the bind of an empty root")
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("marker after the last unbind: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "journal")); string(b) != "kept" {
		t.Fatalf("the root's files after the unbind: %q, %v", b, err)
	}
}

// A directory that is a mount point already (an operator's volume) is used and never
// unmounted; one that is not but has mounts under it is left alone and not detached.
func TestMountRootsLeaveOthersAlone(t *testing.T) {
	base := mountRootsDir(t)
	volume, busy, marker := filepath.Join(base, "volume"), filepath.Join(base, "busy"), filepath.Join(base, "marker")
	mountTmpfs(t, volume)
	mountTmpfs(t, filepath.Join(busy, "l1"))
	r, err := BindMountRoots([]string{volume, busy}, marker, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Dirs(); !slices.Equal(got, []string{volume}) {
		t.Fatalf("Dirs = %q, want only %s", got, volume)
	}
	if isMountPoint(t, busy) {
		t.Fatalf("%s was bound over the mount under it", busy)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if !isMountPoint(t, volume) {
		t.Fatal("Close unmounted a volume a sidecar did not mount")
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("a marker with nothing bound: %v", err)
	}
}

// rootUnderASharedMount binds a fresh directory, base, on itself, shared (as systemd makes
// every mount), and makes base/state a mount root under it.
func rootUnderASharedMount(t *testing.T) (base, root string, r *MountRoots) {
	t.Helper()
	base = mountRootsDir(t)
	if err := unix.Mount(base, base, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", base, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	root = filepath.Join(base, "state")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	r, err := BindMountRoots([]string{root}, filepath.Join(base, "marker"), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	return base, root, r
}

// Under a shared mount (systemd makes every mount shared) the bind is private: a lease's
// mount under it is not copied under the bind's source, the same directory, where a
// helper's detach would leave it.
func TestMountRootsUnderASharedMount(t *testing.T) {
	base, root, r := rootUnderASharedMount(t)
	lease := filepath.Join(root, "l1")
	mountTmpfs(t, lease)
	if got := len(mountsAt(t, lease, false)); got != 1 {
		t.Errorf("%d mounts at %s, want 1: the bind passes its mounts on", got, lease)
	}
	if err := unix.Unmount(lease, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := mountsAt(t, base, true); !slices.Equal(got, []string{base}) {
		t.Errorf("mounts left under %s: %q", base, got)
	}
}

// A root named through a symlink is bound, listed and detached by its real path: the
// helpers' detach follows no symlink.
func TestMountRootsThroughASymlink(t *testing.T) {
	base := mountRootsDir(t)
	root, link := filepath.Join(base, "state"), filepath.Join(base, "link")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(root, link); err != nil {
		t.Fatal(err)
	}
	r, err := BindMountRoots([]string{link}, filepath.Join(base, "marker"), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Dirs(); !slices.Equal(got, []string{root}) {
		t.Errorf("Dirs = %q, want the real %s", got, root)
	}
	if !isMountPoint(t, root) {
		t.Errorf("%s is no mount point", root)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if isMountPoint(t, root) {
		t.Error("Close left the bind")
	}
}

// chrooted says whether this process's root is not its mount namespace's, which entering
// the namespace gives (make fresh-test runs the suites chrooted).
func chrooted(t *testing.T) bool {
	t.Helper()
	type answer struct {
		chrooted bool
		err      error
	}
	done := make(chan answer, 1)
	go func() {
		// Never unlocked: the thread's root and working directory become its own.
		runtime.LockOSThread()
		var self, nsRoot unix.Stat_t
		err := unix.Stat("/", &self)
		if err == nil {
			err = unix.Unshare(unix.CLONE_FS)
		}
		var ns *os.File
		if err == nil {
			ns, err = os.Open("/proc/thread-self/ns/mnt")
		}
		if err == nil {
			err = unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS)
			ns.Close()
		}
		if err == nil {
			err = unix.Stat("/", &nsRoot)
		}
		done <- answer{self.Dev != nsRoot.Dev || self.Ino != nsRoot.Ino, err}
	}()
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	return a.chrooted
}

// mountsInNS lists the mount points at or under dir in mount namespace ns.
func mountsInNS(t *testing.T, ns *os.File, dir string) []string {
	t.Helper()
	type read struct {
		mounts []string
		err    error
	}
	done := make(chan read, 1)
	go func() {
		// Never unlocked: the thread leaves this namespace and must end with the goroutine.
		runtime.LockOSThread()
		var r read
		if r.err = unix.Unshare(unix.CLONE_FS); r.err == nil {
			r.err = unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS)
		}
		var f *os.File
		if r.err == nil {
			f, r.err = os.Open("/proc/thread-self/mountinfo")
		}
		if r.err == nil {
			var ms []*mountinfo.Info
			ms, r.err = mountinfo.GetMountsFromReader(f, mountinfo.PrefixFilter(dir))
			f.Close()
			for _, m := range ms {
				r.mounts = append(r.mounts, m.Mountpoint)
			}
		}
		done <- r
	}()
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	slices.Sort(r.mounts)
	return r.mounts
}

// The helpers' mount namespace holds none of the roots' mounts, neither those made before
// it nor after, while the host's later mounts elsewhere reach it where they propagate.
func TestHelperMountNS(t *testing.T) {
	base, root, r := rootUnderASharedMount(t)
	t.Cleanup(func() { r.Close() })
	mountTmpfs(t, filepath.Join(root, "before"))
	ns, err := r.HelperMountNS()
	if chrooted(t) { // make fresh-test: a helper entering the namespace would leave the chroot
		if !errors.Is(err, errChrooted) {
			t.Fatalf("chrooted, HelperMountNS: %v, %v; want errChrooted", ns, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() }) // before mountRootsDir's cleanup: the namespace goes with it
	mountTmpfs(t, filepath.Join(root, "after"))
	mountTmpfs(t, filepath.Join(base, "host"))
	if got := mountsInNS(t, ns, root); len(got) != 0 {
		t.Errorf("the helpers' namespace has mounts at or under the root: %q", got)
	}
	if got, want := mountsInNS(t, ns, base), []string{base, filepath.Join(base, "host")}; !slices.Equal(got, want) {
		t.Errorf("the helpers' namespace has %q under %s, want %q", got, base, want)
	}
	if got := len(mountsAt(t, root, true)); got != 3 {
		t.Errorf("the daemon's namespace has %d mounts at or under the root, want 3 (its bind and two)", got)
	}
}

// Making the helpers' namespace leaves every thread of the daemon in the daemon's mount
// namespace: a thread left in it (the main thread cannot end) would make /proc/self name
// the wrong namespace.
func TestHelperMountNSLeavesNoThreadBehind(t *testing.T) {
	base := mountRootsDir(t)
	r, err := BindMountRoots([]string{base}, base+".marker", slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); os.Remove(base + ".marker") })
	host, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		ns, err := r.HelperMountNS()
		if err != nil && !(errors.Is(err, errChrooted) && chrooted(t)) {
			t.Fatal(err)
		}
		ns.Close()
	}
	tasks, err := filepath.Glob("/proc/self/task/*/ns/mnt")
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads: %v %v", tasks, err)
	}
	for _, task := range tasks {
		if ns, err := os.Readlink(task); err == nil && ns != host {
			t.Errorf("%s is in %s, not the daemon's %s", task, ns, host)
		}
	}
}
