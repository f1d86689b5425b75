package sandbox

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/fsxfer"
	"github.com/sidecar-sandbox/sidecar/internal/confine"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// testImageOSRelease is what the test image's /etc/os-release says.
const testImageOSRelease = "ID=sidecar-test-image\n"

// testImageBinaries are the host programs copied into the test image, with their libraries.
var testImageBinaries = []string{"sh", "cat", "ls", "id", "touch", "tty", "true"}

// newTestImage builds a two-layer image from host binaries and returns its layers, top
// first: the lower holds the programs, their libraries, an /etc/os-release and /etc/gone,
// a world-writable /scratch; the upper replaces os-release, deletes /etc/gone with an
// overlay whiteout and adds /etc/added.
func newTestImage(t testing.TB) []string {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "sidecar-image-")
	if err != nil {
		t.Fatal(err)
	}
	return newTestImageIn(t, dir)
}

// newTestImageIn is newTestImage in dir, which it removes at the end of the test.
func newTestImageIn(t testing.TB, dir string) []string {
	t.Helper()
	t.Cleanup(func() { os.RemoveAll(dir) }) // no mount point: overlays are under lease dirs
	lower, upper := filepath.Join(dir, "lower"), filepath.Join(dir, "upper")
	for _, name := range testImageBinaries {
		host, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(lower, "bin", name)
		if name == "cat" { // on the PATH through an absolute symlink, as images' alternatives are
			dst = filepath.Join(lower, "usr/libexec", name)
			if err := os.MkdirAll(filepath.Join(lower, "bin"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/usr/libexec/cat", filepath.Join(lower, "bin", name)); err != nil {
				t.Fatal(err)
			}
		}
		copyHostFile(t, host, dst, 0o755)
		for _, lib := range testtool.Libraries(t, host) {
			copyHostFile(t, lib, filepath.Join(lower, lib), 0o755)
		}
	}
	writeTestFile(t, filepath.Join(lower, "etc/os-release"), "ID=lower\n", 0o644)
	writeTestFile(t, filepath.Join(lower, "etc/gone"), "deleted by the upper layer\n", 0o644)
	mkdirMode(t, filepath.Join(lower, "scratch"), 0o777)
	// A mount point the helper binds over, as a symlink (Ubuntu's images have this one):
	// the lease gets a file in its place.
	if err := os.Symlink("/run/systemd/resolve/stub-resolv.conf", filepath.Join(lower, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, filepath.Join(lower, "workspace"), "a file where the lease's workdir goes\n", 0o644)
	writeTestFile(t, filepath.Join(upper, "etc/os-release"), testImageOSRelease, 0o644)
	writeTestFile(t, filepath.Join(upper, "etc/added"), "added\n", 0o644)
	if err := unix.Mknod(filepath.Join(upper, "etc/gone"), unix.S_IFCHR, 0); err != nil { // a whiteout
		t.Fatal(err)
	}
	return []string{upper, lower}
}

// copyHostFile copies what the host's src resolves to into dst, making its directories.
func copyHostFile(t testing.TB, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, dst, string(b), mode)
}

func writeTestFile(t testing.TB, path, data string, mode os.FileMode) {
	t.Helper()
	mkdirMode(t, filepath.Dir(path), 0o755)
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func mkdirMode(t testing.TB, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

// imageRoot is a LeaseRoot on layers with the test image's PATH.
func imageRoot(layers []string) *LeaseRoot {
	return &LeaseRoot{Layers: layers, Env: []string{"PATH=/bin", "HOME=/image-home", "IMAGE_VAR=from-image"}}
}

// mountsUnder lists what is mounted at or under dir, or from lease id's overlay, in this
// thread's mount namespace.
func mountsUnder(t *testing.T, dir, id string) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(func(m *mountinfo.Info) (skip, stop bool) {
		_, in := under(m.Mountpoint, dir)
		return !(in || strings.HasPrefix(m.Source, overlayFSName) && strings.HasSuffix(m.Source, ":"+id)), false
	})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Mountpoint+" ("+m.FSType+" "+m.Source+")")
	}
	return out
}

// A lease in an image sees the image's files, not the host's; /workspace, /tmp, its uid
// and the image's PATH work as on the host's root; what it writes into the image is its
// own, seen by its next command and by no other lease, and gone with the lease.
func TestLeaseRoot(t *testing.T) {
	layers := newTestImage(t)
	hostOnly, err := os.CreateTemp("/var/tmp", "sidecar-host-only-")
	if err != nil {
		t.Fatal(err)
	}
	hostOnly.Close()
	t.Cleanup(func() { os.Remove(hostOnly.Name()) })
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		l := newTestLease(t, s, func(l *LeaseSpec) { l.Root = imageRoot(layers) })
		r := run(t, s, l.ID, sh(`cat /etc/os-release; id -u; pwd; echo "$PATH $HOME $IMAGE_VAR"; ls /etc; [ -e `+hostOnly.Name()+` ] && echo host visible; true`))
		want := testImageOSRelease + strconv.Itoa(l.UID) + "\n/workspace\n/bin /workspace from-image\n"
		if r.exitCode != 0 || !strings.HasPrefix(r.stdout, want) {
			t.Fatalf("in the image: %+v; want stdout to start %q", r, want)
		}
		etc := r.stdout[len(want):]
		for _, f := range []string{"added", "os-release", "passwd"} {
			if !strings.Contains(etc, f+"\n") {
				t.Errorf("/etc lacks %s: %q", f, etc)
			}
		}
		if strings.Contains(etc, "gone") || strings.Contains(etc, "host visible") {
			t.Errorf("a whited-out file or the host's root shows: %q", etc)
		}

		r = run(t, s, l.ID, sh(`cat /proc/self/status`))
		for _, want := range []string{"NoNewPrivs:\t1\n", "Seccomp:\t2\n", "CapEff:\t0000000000000000\n"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("a lease process in the image: no %q in its status:\n%s", want, r.stdout)
			}
		}
		if r := run(t, s, l.ID, Spec{Argv: []string{"cat", "/etc/added"}}); r.exitCode != 0 || r.stdout != "added\n" {
			t.Errorf("a program found on the image's PATH through an absolute symlink: %+v", r)
		}
		if _, _, err := s.Command(l.ID, Spec{Argv: []string{"python3"}}); !errors.Is(err, exec.ErrNotFound) {
			t.Errorf("a host program the image lacks: %v; want not found", err)
		}
		hostResolv, _ := os.ReadFile("/etc/resolv.conf")
		if r := run(t, s, l.ID, sh(`cat /etc/resolv.conf`)); r.exitCode != 0 || r.stdout != string(hostResolv) {
			t.Errorf("/etc/resolv.conf in the image (a symlink there): %+v; want the host's", r)
		}

		r = run(t, s, l.ID, sh(`touch /workspace/w /tmp/t && echo hi > /scratch/mine && cat /scratch/mine; touch /etc/nope 2>/dev/null || echo etc read-only`))
		if r.exitCode != 0 || r.stdout != "hi\netc read-only\n" {
			t.Fatalf("writes: %+v", r)
		}
		for _, p := range []string{filepath.Join(l.Workdir, "w"), filepath.Join(l.TmpDir, "t")} {
			if _, err := os.Stat(p); err != nil {
				t.Errorf("the lease's file on the host: %v", err)
			}
		}
		if r := run(t, s, l.ID, sh(`cat /scratch/mine`)); r.exitCode != 0 || r.stdout != "hi\n" {
			t.Errorf("the lease's second command: %+v; want its file", r)
		}
		other := newTestLease(t, s, func(o *LeaseSpec) { o.Root = imageRoot(layers) })
		if r := run(t, s, other.ID, sh(`cat /scratch/mine`)); r.exitCode == 0 {
			t.Errorf("another lease on the same layers sees the file: %+v", r)
		}

		teardownLeavesNoRoot(t, s, l)
		for _, layer := range layers {
			if _, err := os.Stat(filepath.Join(layer, "scratch/mine")); !os.IsNotExist(err) {
				t.Errorf("the lease's file reached layer %s: %v", layer, err)
			}
		}
	})
}

// teardownLeavesNoRoot tears lease l down and checks that nothing of its root is left
// mounted (its overlay, id-mapped layers), so that its directory, writable layer and all,
// goes as the lease manager removes it.
func teardownLeavesNoRoot(t *testing.T, s *Sandbox, l LeaseSpec) {
	t.Helper()
	base := filepath.Dir(l.Workdir)
	if err := s.Teardown(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Retire(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	if ms := mountsUnder(t, base, l.ID); len(ms) > 0 {
		t.Errorf("mounted after release: %q", ms)
	}
	if err := fsxfer.RemoveTree(filepath.Join(base, "root")); err != nil {
		t.Errorf("removing the lease's root after release: %v", err)
	}
}

// What a lease writes into its image counts against its disk: with the lease directory on
// a small filesystem of its own (as a disk quota makes it), a write past it fails with
// ENOSPC.
func TestLeaseRootDiskFull(t *testing.T) {
	layers := newTestImage(t)
	testtool.Need(t, "mkfs.ext4", "e2fsprogs", "it makes the lease's small disk")
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		l := newTestLease(t, s, func(l *LeaseSpec) {
			mountSmallDisk(t, filepath.Dir(l.Workdir), 8<<20)
			for _, d := range []string{l.Workdir, l.TmpDir} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			l.Root = imageRoot(layers)
		})
		r := run(t, s, l.ID, sh(`cat /dev/zero > /scratch/big; echo "exit $?"`))
		if !strings.Contains(r.stderr, "No space left on device") || !strings.HasPrefix(r.stdout, "exit 1") {
			t.Errorf("a write past the lease's disk: %+v; want ENOSPC", r)
		}
	})
}

// mountSmallDisk mounts a fresh ext4 filesystem of size bytes on dir (its contents hidden
// until the cleanup unmounts it, after the lease's own cleanup).
func mountSmallDisk(t testing.TB, dir string, size int64) {
	t.Helper()
	img := dir + ".img"
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(size)
	f.Close()
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-O", "^has_journal", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	// Registered before the lease's cleanup, so run after it: the lease is gone first.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", dir, err, out)
		}
		os.Remove(img)
		os.RemoveAll(dir) // unmounted: what was under the disk
	})
	if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v\n%s", img, err, out)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
}

// A mount point of the lease's root that a lease (or an image) turned into a symlink is
// never mounted through: the command does not start. Cold, so that no launcher set up
// before the symlink was made takes the command.
func TestLeaseRootSymlinkedMountPoint(t *testing.T) {
	layers := newTestImage(t)
	for _, h := range testHelpers {
		t.Run(h.name, func(t *testing.T) {
			s := newTestSandboxConfig(t, Config{HelperPath: h.usable(t), ColdStart: true})
			l := newTestLease(t, s, func(l *LeaseSpec) { l.Root = imageRoot(layers) })
			tmp := filepath.Join(leaseRootDirs(l).merged, "tmp")
			if err := os.Remove(tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/etc", tmp); err != nil {
				t.Fatal(err)
			}
			cmd, tr, err := s.Command(l.ID, sh("true"))
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			err = tr.Start()
			if err == nil {
				cmd.Wait()
				t.Fatal("a command started with /tmp of its root a symlink to /etc")
			}
			if !strings.Contains(err.Error(), "on /tmp: ") {
				t.Errorf("start: %v; want the /tmp bind refused", err)
			}
		})
	}
}

// Provision again (a restart adopting the lease) keeps a mounted root as it is and mounts
// an unmounted one again on the same writable layer; Sweep unmounts the root of a lease
// the daemon no longer knows, even one this Sandbox never provisioned (a crash).
func TestLeaseRootAdoptAndSweep(t *testing.T) {
	layers := newTestImage(t)
	// Cold: no launcher or spare cgroup of this Sandbox's may appear in the lease's cgroup
	// while the other one sweeps it (a daemon owns its parent alone; two here share it).
	s := newTestSandboxConfig(t, Config{HelperPath: goHelperPath(t), ColdStart: true})
	l := newTestLease(t, s, func(l *LeaseSpec) { l.Root = imageRoot(layers) })
	if r := run(t, s, l.ID, sh("echo kept > /scratch/f")); r.exitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	merged := leaseRootDirs(l).merged
	ctx := context.Background()
	if err := s.Provision(ctx, l); err != nil {
		t.Fatal(err)
	}
	if ms := mountsUnder(t, merged, l.ID); len(ms) != 1 {
		t.Errorf("mounts after Provision again: %q; want the one overlay", ms)
	}
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Provision(ctx, l); err != nil {
		t.Fatal(err)
	}
	if r := run(t, s, l.ID, sh("cat /scratch/f")); r.exitCode != 0 || r.stdout != "kept\n" {
		t.Errorf("after the root was mounted again: %+v; want the lease's file", r)
	}

	// Another daemon on the host, with a cgroup parent of its own, sweeps only its own.
	const neighbourParent = testCgroupParent + "-neighbour"
	t.Cleanup(func() { confine.RemoveEmptyParent(neighbourParent) })
	neighbour := newTestSandboxConfig(t, Config{HelperPath: goHelperPath(t), CgroupParent: neighbourParent})
	if _, _, err := neighbour.Sweep(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if r := run(t, s, l.ID, sh("cat /scratch/f")); r.exitCode != 0 || r.stdout != "kept\n" {
		t.Errorf("after another daemon's sweep: %+v; want the lease's file", r)
	}

	s.settle()
	other := newTestSandbox(t) // a daemon after a crash: it never provisioned l
	gone, _, err := other.Sweep(ctx, func(id string) bool { return id != l.ID })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(gone, l.ID) {
		t.Errorf("Sweep = %q; want %s among them", gone, l.ID)
	}
	if ms := mountsUnder(t, filepath.Dir(l.Workdir), l.ID); len(ms) > 0 {
		t.Errorf("mounted after Sweep: %q", ms)
	}
}

// A terminal command in an image root gets a PTY of the lease's own instance, and its
// /dev/tty.
func TestLeaseRootTTY(t *testing.T) {
	layers := newTestImage(t)
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		l := newTestLease(t, s, func(l *LeaseSpec) { l.Root = imageRoot(layers) })
		cmd, tr, err := s.Command(l.ID, Spec{Argv: []string{"/bin/sh", "-c", "tty; echo tty-ok > /dev/tty"}, TTY: true})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		out := runTTY(t, s, l.ID, cmd, tr)
		if !strings.Contains(out, "/dev/pts/0\r\n") || !strings.Contains(out, "tty-ok") {
			t.Errorf("on a terminal: %q; want /dev/pts/0 and tty-ok", out)
		}
	})
}

// A root is refused, before anything is made for the lease, when overlayfs could not take
// its layers or the lease directory has no place for it.
func TestValidateRoot(t *testing.T) {
	layer := t.TempDir()
	base := LeaseSpec{ID: "l", Workdir: "/leases/l/work", TmpDir: "/leases/l/tmp"}
	for name, tc := range map[string]struct {
		mod func(*LeaseSpec)
		ok  bool
	}{
		"valid":           {func(l *LeaseSpec) { l.Root = &LeaseRoot{Layers: []string{layer}, Env: []string{"PATH=/bin"}} }, true},
		"no root":         {func(l *LeaseSpec) {}, true},
		"no layers":       {func(l *LeaseSpec) { l.Root = &LeaseRoot{} }, false},
		"relative layer":  {func(l *LeaseSpec) { l.Root = &LeaseRoot{Layers: []string{"layer"}} }, false},
		"colon in layer":  {func(l *LeaseSpec) { l.Root = &LeaseRoot{Layers: []string{layer + ":x"}} }, false},
		"comma in layer":  {func(l *LeaseSpec) { l.Root = &LeaseRoot{Layers: []string{layer + ",x"}} }, false},
		"missing layer":   {func(l *LeaseSpec) { l.Root = &LeaseRoot{Layers: []string{layer + "/missing"}} }, false},
		"too many layers": {func(l *LeaseSpec) { l.Root = &LeaseRoot{Layers: slices.Repeat([]string{layer}, 4096/len(layer)+1)} }, false},
		"env without =":   {func(l *LeaseSpec) { l.Root = &LeaseRoot{Layers: []string{layer}, Env: []string{"PATH"}} }, false},
		"dirs apart":      {func(l *LeaseSpec) { l.TmpDir = "/elsewhere/tmp"; l.Root = &LeaseRoot{Layers: []string{layer}} }, false},
		"workdir under root": {func(l *LeaseSpec) {
			l.Workdir, l.TmpDir = "/work", "/tmp"
			l.Root = &LeaseRoot{Layers: []string{layer}}
		}, false},
	} {
		l := base
		tc.mod(&l)
		if err := validateRoot(l); (err == nil) != tc.ok || err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v; want ok %v, else ErrInvalid", name, err, tc.ok)
		}
	}
}

// Without strict isolation there is no mount namespace to pivot in: a lease with a root is
// refused, and nothing is mounted for it.
func TestLeaseRootNeedsStrictIsolation(t *testing.T) {
	s, err := New(Config{Isolation: IsolationNone, HelperPath: goHelperPath(t)})
	if err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(t.TempDir(), "lease")
	l := LeaseSpec{ID: "none-root", Workdir: filepath.Join(work, "work"), TmpDir: filepath.Join(work, "tmp"),
		Root: &LeaseRoot{Layers: []string{t.TempDir()}}}
	for _, d := range []string{l.Workdir, l.TmpDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Provision(context.Background(), l); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Provision: %v; want ErrUnsupported", err)
	}
	if _, err := os.Stat(filepath.Join(work, "root")); !os.IsNotExist(err) {
		t.Errorf("made for the refused lease: %v", err)
	}
}

// At every Landlock ABI (and without Landlock) a lease in an image reads all of it and
// writes where file modes let it; with Landlock, never into /proc, which file modes alone
// would allow for its own processes.
func TestLeaseRootLandlockABIs(t *testing.T) {
	layers := newTestImage(t)
	for _, abi := range []int{1, 3, NoLandlock} {
		t.Run(strconv.Itoa(abi), func(t *testing.T) {
			s := newTestSandboxConfig(t, Config{HelperPath: goHelperPath(t), LandlockMaxABI: abi})
			l := newTestLease(t, s, func(l *LeaseSpec) { l.Root = imageRoot(layers) })
			r := run(t, s, l.ID, sh(`ls / >/dev/null && echo hi > /scratch/x && cat /scratch/x /etc/os-release; echo 600 2>/dev/null > /proc/self/oom_score_adj && echo proc written`))
			want := "hi\n" + testImageOSRelease
			if abi == NoLandlock {
				want += "proc written\n"
			}
			if r.stdout != want {
				t.Errorf("at ABI %d: %+v; want stdout %q", abi, r, want)
			}
		})
	}
}
