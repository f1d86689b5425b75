package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// rootImage is the test image (newTestImage) on a small ext4 filesystem of its own (the
// image store's filesystem must support id-mapped mounts, which tmpfs gets only in Linux
// 6.3), with the tools the root checks run besides, and a
// root-owned /usr/local/bin for a lease to install into.
func rootImage(t testing.TB) []string {
	t.Helper()
	testtool.Need(t, "mkfs.ext4", "e2fsprogs", "it makes the image's filesystem")
	dir, err := os.MkdirTemp("/var/tmp", "sidecar-root-image-")
	if err != nil {
		t.Fatal(err)
	}
	mountSmallDisk(t, dir, 64<<20)
	layers := newTestImageIn(t, dir)
	lower := layers[len(layers)-1]
	for _, name := range []string{"stat", "unshare", "mkdir", "chown", "chmod", "sleep", "mv"} { // kill and printf: the shell's
		host, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		copyHostFile(t, host, filepath.Join(lower, "bin", name), 0o755)
		for _, lib := range testtool.Libraries(t, host) {
			copyHostFile(t, lib, filepath.Join(lower, lib), 0o755)
		}
	}
	mkdirMode(t, filepath.Join(lower, "usr/local/bin"), 0o755)
	return layers
}

// A lease on an image with AsRoot runs as root in a user namespace of its own: it owns the
// image's files (through id-mapped layers) and its own, installs into the image's
// directories, in its writable layer only; on the host everything it made is its uid's.
// It gains nothing over another lease or the host: their files stay out of reach, and
// namespaces and mounts stay refused.
func TestLeaseRootAsRoot(t *testing.T) {
	layers := rootImage(t)
	root := func(l *LeaseSpec) { l.Root = imageRoot(layers); l.Root.AsRoot = true }
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		if !s.Caps().RootLeases {
			// The Go helper cannot enter a user namespace: the lease is refused, named why.
			base, err := os.MkdirTemp("/var/tmp", "sidecar-sandbox-")
			if err != nil {
				t.Fatal(err)
			}
			defer os.RemoveAll(base)
			l := LeaseSpec{ID: "t-root-refused", UID: 300001, GID: 300001, Workdir: filepath.Join(base, "work"), TmpDir: filepath.Join(base, "tmp")}
			os.Mkdir(l.Workdir, 0o700)
			os.Mkdir(l.TmpDir, 0o700)
			root(&l)
			if err := s.Provision(context.Background(), l); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "C sandbox helper") {
				t.Fatalf("a root lease with the Go helper: %v; want ErrUnsupported naming the C helper", err)
			}
			return
		}
		l := newTestLease(t, s, root)
		other := newTestLease(t, s, root)
		r := run(t, s, l.ID, sh(`id -u; id -g; echo $USER; stat -c '%u %g' /etc/os-release /usr/local/bin /workspace /tmp`))
		if want := "0\n0\nroot\n0 0\n0 0\n0 0\n0 0\n"; r.exitCode != 0 || r.stdout != want {
			t.Fatalf("who a root lease is and what it owns: %+v; want %q", r, want)
		}
		if !cold(t) { // a launcher ahead, in the namespace already, takes the next command
			first := readyLauncher(t, s, l.ID)
			if r := run(t, s, l.ID, sh(`echo $$; id -u`)); r.stdout != strconv.Itoa(first.PID)+"\n0\n" {
				t.Errorf("a command of a root lease: %+v; want it run by launcher %d, as root", r, first.PID)
			}
		}
		// An install: into the image's root-owned directories, a file chowned and made
		// set-uid (which nosuid and no_new_privs leave without effect), an edit of /etc.
		r = run(t, s, l.ID, sh(`printf '#!/bin/sh\necho installed\n' > /usr/local/bin/tool && chown 0:0 /usr/local/bin/tool && chmod 4755 /usr/local/bin/tool && echo ID=edited > /etc/os-release && mkdir /etc/tool.d && /usr/local/bin/tool && cat /etc/os-release`))
		if r.exitCode != 0 || r.stdout != "installed\nID=edited\n" {
			t.Fatalf("an install as root: %+v", r)
		}
		upper := filepath.Join(leaseRootDirs(l).upper, "usr/local/bin/tool")
		if st, err := os.Stat(upper); err != nil || int(st.Sys().(*syscall.Stat_t).Uid) != l.UID {
			t.Errorf("the installed file on the host: %v; want it in the writable layer, owned by uid %d", st, l.UID)
		}
		for _, layer := range layers {
			if _, err := os.Stat(filepath.Join(layer, "usr/local/bin/tool")); !os.IsNotExist(err) {
				t.Errorf("the install reached layer %s: %v", layer, err)
			}
		}
		if r := run(t, s, other.ID, sh(`cat /etc/os-release; test -e /usr/local/bin/tool && echo installed; true`)); r.stdout != testImageOSRelease {
			t.Errorf("another root lease on the same image: %+v; want the image's files only", r)
		}
		// Other processes (the host's, another lease's) stay out of sight, and namespaces
		// out of reach.
		r = run(t, s, other.ID, sh(`sleep 30 >/dev/null 2>&1 & echo $!`))
		for _, cmd := range []string{
			"ls /proc/1/root/", "kill -0 " + strings.TrimSpace(r.stdout),
			"unshare -U true", "unshare -r true", "unshare -m true", "unshare -n true",
		} {
			if r := run(t, s, l.ID, sh(cmd)); r.exitCode == 0 {
				t.Errorf("%s as root in a lease: exit 0 (%+v)", cmd, r)
			}
		}
		// Root holds Docker's default capabilities there, however the daemon was started
		// (a unit's bound or none): joining the namespace gave it every one.
		r = run(t, s, l.ID, sh(`cat /proc/self/status`))
		caps := fmt.Sprintf("%016x", initproc.RootCaps)
		for _, want := range []string{"NoNewPrivs:\t1\n", "Seccomp:\t2\n", "CapEff:\t" + caps + "\n", "CapBnd:\t" + caps + "\n", "CapInh:\t0000000000000000\n"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("a root lease process: no %q in its status:\n%s", want, r.stdout)
			}
		}
		teardownLeavesNoRoot(t, s, l)
	})
}

// A lease on an image it owns (LeaseRoot.Owned) runs as its uid with no capability, and
// owns what root owns in the image: it changes the image's files in its writable layer
// as root in a container would, privately, and nothing of it outlives the lease.
func TestLeaseRootOwned(t *testing.T) {
	layers := rootImage(t)
	owned := func(l *LeaseSpec) { l.Root = imageRoot(layers); l.Root.Owned = true }
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		if !s.Caps().RootLeases {
			return // the Go helper cannot make the namespace: the daemon never asks (TestLeaseRootAsRoot checks the refusal)
		}
		l := newTestLease(t, s, owned)
		other := newTestLease(t, s, owned)
		uid := strconv.Itoa(l.UID)
		r := run(t, s, l.ID, sh(`id -u; echo $USER; stat -c '%u' /etc/os-release /usr/local/bin; cat /proc/self/status`))
		if want := uid + "\nuser\n" + uid + "\n" + uid + "\n"; r.exitCode != 0 || !strings.HasPrefix(r.stdout, want) || !strings.Contains(r.stdout, "CapEff:\t0000000000000000\n") {
			t.Fatalf("who an owning lease is and what it owns: %+v; want %q and no capability", r, want)
		}
		r = run(t, s, l.ID, sh(`printf '#!/bin/sh\necho installed\n' > /usr/local/bin/tool && chmod 755 /usr/local/bin/tool && echo ID=edited > /etc/os-release && /usr/local/bin/tool && cat /etc/os-release`))
		if r.exitCode != 0 || r.stdout != "installed\nID=edited\n" {
			t.Fatalf("an install into the image's directories: %+v", r)
		}
		if st, err := os.Stat(filepath.Join(leaseRootDirs(l).upper, "usr/local/bin/tool")); err != nil || int(st.Sys().(*syscall.Stat_t).Uid) != l.UID {
			t.Errorf("the installed file on the host: %v; want it in the writable layer, owned by uid %d", st, l.UID)
		}
		if r := run(t, s, other.ID, sh(`cat /etc/os-release; test -e /usr/local/bin/tool && echo installed; true`)); r.stdout != testImageOSRelease {
			t.Errorf("another lease on the same image: %+v; want the image's files only", r)
		}
		for _, cmd := range []string{"unshare -U true", "unshare -r true", "chown 0 /etc/os-release"} {
			if r := run(t, s, l.ID, sh(cmd)); r.exitCode == 0 {
				t.Errorf("%s in an owning lease: exit 0 (%+v)", cmd, r)
			}
		}
		teardownLeavesNoRoot(t, s, l)
	})
}

// ProbeRootLeases passes where root leases work (the C helper; an overlay on an id-mapped
// layer of the directory's filesystem, ext4 here) and leaves nothing there; with the Go
// helper it refuses, naming the C helper.
func TestProbeRootLeases(t *testing.T) {
	testtool.Need(t, "mkfs.ext4", "e2fsprogs", "it makes the store's filesystem")
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		dir, err := os.MkdirTemp("/var/tmp", "sidecar-probe-")
		if err != nil {
			t.Fatal(err)
		}
		mountSmallDisk(t, dir, 16<<20)
		os.Remove(filepath.Join(dir, "lost+found"))
		err = s.ProbeRootLeases(dir)
		switch {
		case s.Caps().RootLeases && err != nil:
			t.Fatalf("ProbeRootLeases: %v", err)
		case !s.Caps().RootLeases && (!errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "C sandbox helper")):
			t.Fatalf("ProbeRootLeases with the Go helper: %v; want ErrUnsupported naming the C helper", err)
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Errorf("the probe left %v", entries)
		}
	})
}

// One helper makes the leases' user namespaces: each is new and maps 0 onto the uid and
// gid asked for; a helper that dies is replaced at the next request, and close ends it.
func TestUserNSFactory(t *testing.T) {
	testtool.Need(t, "nsenter", "util-linux", "it reads a namespace's maps from inside")
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		if !s.Caps().RootLeases {
			return // the Go helper makes none: TestProbeRootLeases checks the refusal
		}
		f := s.userns
		maps := func(ns *os.File) string {
			cmd := exec.Command("nsenter", "--user=/proc/self/fd/3", "cat", "/proc/self/uid_map", "/proc/self/gid_map")
			cmd.ExtraFiles = []*os.File{ns}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("nsenter: %v: %s", err, out)
			}
			return strings.Join(strings.Fields(string(out)), " ")
		}
		seen := map[uint64]bool{}
		var helper int
		for i, id := range []int{70001, 70002, 70003} {
			ns, err := f.make(id, id+100)
			if err != nil {
				t.Fatal(err)
			}
			defer ns.Close()
			var st syscall.Stat_t
			if err := syscall.Fstat(int(ns.Fd()), &st); err != nil {
				t.Fatal(err)
			}
			if seen[st.Ino] {
				t.Errorf("namespace %d is one made before", i)
			}
			seen[st.Ino] = true
			want := "0 " + strconv.Itoa(id) + " 1 0 " + strconv.Itoa(id+100) + " 1"
			if got := maps(ns); got != want {
				t.Errorf("maps of namespace %d: %q, want %q", i, got, want)
			}
			if i == 0 {
				helper = f.cmd.Process.Pid
			} else if f.cmd.Process.Pid != helper {
				t.Errorf("request %d started helper %d; want the one helper %d", i, f.cmd.Process.Pid, helper)
			}
		}
		if err := syscall.Kill(helper, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		ns, err := f.make(70004, 70004)
		if err != nil {
			t.Fatalf("after the helper died: %v", err)
		}
		ns.Close()
		if f.cmd.Process.Pid == helper {
			t.Error("the dead helper was not replaced")
		}
		replaced := f.cmd.Process.Pid
		f.close()
		for _, pid := range []int{helper, replaced} {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
				t.Errorf("helper %d still runs after close", pid)
			}
		}
	})
}

// A lease whose root is id-mapped starts with stacked directories under its workdir and
// home (a snapshot's, for a lease started from one): their content is there, its uid's,
// nothing of it copied onto the lease's disk; what it changes (a rename of a stacked
// directory included) stays its own, and teardown leaves nothing mounted.
func TestLeaseRootStacks(t *testing.T) {
	layers := rootImage(t)
	seed := filepath.Join(filepath.Dir(layers[len(layers)-1]), "seed") // on the image's filesystem
	for path, content := range map[string]string{"workspace/repo/README": "seeded\n", "workspace/repo/dir/f": "f\n", "home/" + LeaseUser + "/.profile": "profile\n"} {
		if err := os.MkdirAll(filepath.Join(seed, filepath.Dir(path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(seed, path), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stacked := func(l *LeaseSpec) {
		l.HomeDir = filepath.Join(filepath.Dir(l.Workdir), "home")
		if err := os.Mkdir(l.HomeDir, 0o700); err != nil {
			t.Fatal(err)
		}
		l.Root = imageRoot(layers)
		l.Root.Owned = true
		l.Root.Stacks = []Stack{{Dir: l.Workdir, Lower: filepath.Join(seed, "workspace")}, {Dir: l.HomeDir, Lower: filepath.Join(seed, "home")}}
	}
	forEachHelper(t, func(t *testing.T, s *Sandbox) {
		if !s.Caps().RootLeases {
			return // the Go helper cannot make the namespace: the daemon never asks
		}
		l := newTestLease(t, s, stacked)
		other := newTestLease(t, s, stacked)
		uid := strconv.Itoa(l.UID)
		r := run(t, s, l.ID, sh(`cat /workspace/repo/README ~/.profile; stat -c '%u %a' /workspace /workspace/repo/README ~/.profile`))
		if want := "seeded\nprofile\n" + uid + " 700\n" + uid + " 644\n" + uid + " 644\n"; r.exitCode != 0 || r.stdout != want {
			t.Fatalf("the stacked workspace and home: %+v; want %q", r, want)
		}
		r = run(t, s, l.ID, sh(`echo mine > /workspace/repo/README && mv /workspace/repo/dir /workspace/moved && cat /workspace/moved/f && echo new > ~/new && ls /workspace`))
		if r.exitCode != 0 || r.stdout != "f\nmoved\nrepo\n" {
			t.Fatalf("changing the stacked directories (a directory renamed): %+v", r)
		}
		if r := run(t, s, other.ID, sh(`cat /workspace/repo/README; ls /workspace/repo; test -e ~/new || echo none`)); r.stdout != "seeded\nREADME\ndir\nnone\n" {
			t.Errorf("another lease on the same stacks: %+v; want the seed only", r)
		}
		if b, err := os.ReadFile(filepath.Join(seed, "workspace/repo/README")); err != nil || string(b) != "seeded\n" {
			t.Errorf("the seed after a lease wrote: %q, %v", b, err)
		}
		// Nothing of the seed was copied: the lease's side holds only what it wrote.
		upper, _ := leaseRootDirs(l).stack(0)
		if _, err := os.Lstat(filepath.Join(upper, "moved/f")); err == nil {
			t.Error("the renamed directory's content was copied into the lease's upper")
		}
		teardownLeavesNoRoot(t, s, l)
		if entries, err := os.ReadDir(l.Workdir); err != nil || len(entries) != 0 {
			t.Errorf("the lease's workdir after teardown: %v, %v; want it empty, the stack unmounted", entries, err)
		}
	})
}
