package sandbox

import (
	"bytes"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/fsxfer"
)

// A lease on an image with LeaseRoot.AsRoot runs as root in a user namespace of its own,
// so that it can install packages as it would in a container: uid and gid 0 there are
// the lease's uid and gid on the host, and no other id exists there. Root in it owns what
// the lease's uid owns on the host (its workdir, home, tmp and writable layer) and, through
// id-mapped mounts of the image's layers, what the image's root owns, read-only below the
// writable layer; it owns nothing else. It holds capabilities only in that namespace, which
// owns no other namespace (the lease's mount, network, pid and cgroup namespaces are the
// host's user namespace's), and the seccomp filter refuses every namespace, mount, keyring
// and BPF call as for any lease. docs/operations.md section 8 lists the kernel surface.
//
// One namespace per lease: the sandbox holds its descriptor from Provision to Teardown,
// and every helper of the lease enters it (initproc.Config.UserNS), so that all of the
// lease's processes share one root.

// errRootLeases refuses a root lease where this sandbox cannot run one.
var errRootLeases = fmt.Errorf("%w: root in a lease needs strict isolation and the C sandbox helper (sidecar-init built from cmd/sidecar-init/sidecar-init.c: `make build` makes it where a C compiler and a static libc exist); a Go helper cannot enter a user namespace", ErrUnsupported)

// cHelper says whether helper is the C one, which alone can run a lease as root in a user
// namespace (setns into one takes a single-threaded process) and fork launchers as a
// zygote (a Go program cannot fork and go on running): every Go binary carries build
// information, a C one none.
func cHelper(helper string) bool {
	_, err := buildinfo.ReadFile(helper)
	return err != nil
}

// usernsFactory makes the leases' user namespaces, each mapping 0 onto one uid and gid.
// The daemon cannot make one itself (the kernel takes only single-threaded processes into
// a user namespace), cloning a child of the daemon into one costs a full fork of it, and
// starting the C helper for each costs a fork and exec of the daemon (~2 ms): one
// long-lived helper (`sidecar-init userns`) clones a small child into a new namespace on
// request instead, the daemon writes its maps from outside and opens it, and the child is
// killed. Requests are served one at a time, over blocking pipes (a round trip through the
// runtime's poller costs more than the namespace); the helper starts at the first and
// exits when close shuts its stdin (or the daemon dies).
type usernsFactory struct {
	helper string

	mu      sync.Mutex
	cmd     *exec.Cmd
	in, out int // the daemon's ends of the helper's stdin and stdout
	stderr  *bytes.Buffer
}

// errUserNS is how a namespace the host refuses is reported.
const errUserNS = "sandbox: user namespace (a systemd unit's RestrictNamespaces= must allow user)"

// make returns a new user namespace mapping 0 onto uid and gid.
func (f *usernsFactory) make(uid, gid int) (*os.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var pid int
	for {
		running := f.cmd != nil
		if !running {
			if err := f.start(); err != nil {
				return nil, err
			}
		}
		var err error
		if pid, err = f.request(); err == nil {
			break
		}
		if !running || f.cmd != nil { // refused, or a helper just started failed
			return nil, err
		}
		// The helper that served earlier requests is gone (killed, say): start another.
	}
	ns, err := holdUserNS(pid, uid, gid)
	if derr := f.send('D'); derr != nil && err == nil {
		err = derr
	}
	if err != nil && ns != nil {
		ns.Close()
		ns = nil
	}
	return ns, err
}

func (f *usernsFactory) start() error {
	var in, out [2]int
	if err := unix.Pipe2(in[:], unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("%s: %w", errUserNS, err)
	}
	if err := unix.Pipe2(out[:], unix.O_CLOEXEC); err != nil {
		unix.Close(in[0])
		unix.Close(in[1])
		return fmt.Errorf("%s: %w", errUserNS, err)
	}
	stdin, stdout := os.NewFile(uintptr(in[0]), "userns-stdin"), os.NewFile(uintptr(out[1]), "userns-stdout")
	defer stdin.Close() // the helper's ends: it has them once started
	defer stdout.Close()
	f.stderr = new(bytes.Buffer)
	cmd := &exec.Cmd{Path: f.helper, Args: []string{f.helper, "userns"}, Env: []string{}, Stdin: stdin, Stdout: stdout, Stderr: f.stderr}
	if err := cmd.Start(); err != nil {
		unix.Close(in[1])
		unix.Close(out[0])
		return fmt.Errorf("%s: %w", errUserNS, err)
	}
	f.cmd, f.in, f.out = cmd, in[1], out[0]
	return nil
}

// send writes one request byte to the helper.
func (f *usernsFactory) send(b byte) error {
	for {
		_, err := unix.Write(f.in, []byte{b})
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return f.lost(err)
		}
		return nil
	}
}

// request asks for a namespace and returns the pid of the child that holds it.
func (f *usernsFactory) request() (int, error) {
	if err := f.send('N'); err != nil {
		return 0, err
	}
	var line []byte
	buf := make([]byte, 64)
	for !bytes.HasSuffix(line, []byte{'\n'}) {
		n, err := unix.Read(f.out, buf)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, f.lost(err)
		case n == 0:
			return 0, f.lost(io.ErrUnexpectedEOF)
		case len(line)+n > 64:
			return 0, f.lost(fmt.Errorf("an answer over 64 bytes"))
		}
		line = append(line, buf[:n]...)
	}
	answer := strings.TrimSuffix(string(line), "\n")
	if msg, refused := strings.CutPrefix(answer, "E "); refused {
		return 0, fmt.Errorf("%s: %s", errUserNS, msg)
	}
	pid, err := strconv.Atoi(answer)
	if err != nil || pid <= 0 {
		return 0, f.lost(fmt.Errorf("bad answer %q", answer))
	}
	return pid, nil
}

// lost stops a helper that failed the protocol; the next request starts another.
func (f *usernsFactory) lost(err error) error {
	f.stop()
	return fmt.Errorf("%s: %v %s", errUserNS, err, strings.TrimSpace(f.stderr.String()))
}

func (f *usernsFactory) stop() {
	if f.cmd == nil {
		return
	}
	unix.Close(f.in) // the helper exits at end of file
	_ = f.cmd.Wait()
	unix.Close(f.out)
	f.cmd = nil
}

func (f *usernsFactory) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stop()
}

// holdUserNS maps 0 onto uid and gid in the user namespace of process pid and opens it.
func holdUserNS(pid, uid, gid int) (*os.File, error) {
	proc := "/proc/" + strconv.Itoa(pid)
	for _, m := range []struct {
		file string
		id   int
	}{{"uid_map", uid}, {"gid_map", gid}} {
		if err := os.WriteFile(proc+"/"+m.file, []byte("0 "+strconv.Itoa(m.id)+" 1"), 0); err != nil {
			return nil, fmt.Errorf("sandbox: user namespace: %w", err)
		}
	}
	ns, err := os.Open(proc + "/ns/user")
	if err != nil {
		return nil, fmt.Errorf("sandbox: user namespace: %w", err)
	}
	return ns, nil
}

// lowerDirs are where a root lease's id-mapped layers are mounted while its overlay is.
func (d rootDirs) lowerDirs() string { return filepath.Join(d.base, "lower") }

// mountIDMappedLayers mounts each layer, id-mapped through userns (the image's uid and gid
// 0 become the lease's), read-only, on a directory of its own under d.lowerDirs(), and
// returns those directories in the same order. The overlay keeps private clones of its
// layers, so unmountIDMappedLayers may detach these as soon as it is mounted. They are
// mounted on a small tmpfs of their own, so that one unmount takes them all: each unmount
// waits for an RCU grace period, the largest part of a lease's id-mapping cost.
func mountIDMappedLayers(d rootDirs, layers []string, userns *os.File) ([]string, error) {
	if err := unmountIDMappedLayers(d); err != nil { // what a crash in between left
		return nil, err
	}
	if err := os.Mkdir(d.lowerDirs(), 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mount("sidecar-layers", d.lowerDirs(), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0700,size=64k"); err != nil {
		return nil, fmt.Errorf("sandbox: layers: %w", err)
	}
	dirs := make([]string, len(layers))
	for i, layer := range layers {
		dirs[i] = filepath.Join(d.lowerDirs(), strconv.Itoa(i))
		if err := os.Mkdir(dirs[i], 0o700); err != nil {
			return nil, err
		}
		if err := mountIDMapped(layer, dirs[i], userns); err != nil {
			return nil, err
		}
	}
	return dirs, nil
}

// mountIDMapped binds dir on target, id-mapped through userns, read-only (idmapped mounts:
// Linux 5.12; as overlayfs layers: 5.19).
func mountIDMapped(dir, target string, userns *os.File) error {
	fd, err := idMappedTree(dir, userns)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("sandbox: layer %s: move_mount: %w", dir, err)
	}
	return nil
}

// idMappedTree is a detached read-only bind of dir, id-mapped through userns.
func idMappedTree(dir string, userns *os.File) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("sandbox: layer %s: open_tree: %w", dir, err)
	}
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(userns.Fd()),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("sandbox: layer %s: id-mapped mount (the image store's filesystem must take them: ext4, xfs, btrfs; tmpfs from Linux 6.3): %w", dir, err)
	}
	return fd, nil
}

// ProbeRootLeases checks that leases may run as root with their layers under dir: the
// helper can enter a user namespace, this process may make one (a systemd unit's
// RestrictNamespaces= must allow user), and an overlay mounts on an id-mapped layer of
// dir's filesystem (Linux 5.19). It leaves nothing behind.
func (s *Sandbox) ProbeRootLeases(dir string) error {
	if !s.caps.RootLeases {
		return errRootLeases
	}
	ns, err := s.userns.make(65534, 65534)
	if err != nil {
		return err
	}
	defer ns.Close()
	probe, err := os.MkdirTemp(dir, ".root-probe-")
	if err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	d := rootDirs{base: probe, upper: filepath.Join(probe, "upper"), work: filepath.Join(probe, "work"), merged: filepath.Join(probe, "merged")}
	layer := filepath.Join(probe, "layer")
	for _, p := range []string{d.upper, d.work, d.merged, layer} {
		if err := os.Mkdir(p, 0o700); err != nil {
			return errors.Join(fmt.Errorf("sandbox: %w", err), fsxfer.RemoveTree(probe))
		}
	}
	lowers, err := mountIDMappedLayers(d, []string{layer}, ns)
	if err == nil {
		if err = unix.Mount("sidecar-root-probe", d.merged, "overlay", unix.MS_RDONLY, overlayOptions(d, lowers)); err != nil {
			err = fmt.Errorf("sandbox: an overlay on an id-mapped layer (Linux 5.19): %w", err)
		}
	}
	if uerr := errors.Join(unmountOverlay(d.merged), unmountIDMappedLayers(d)); uerr != nil {
		return errors.Join(err, uerr) // the probe directory stays: something may be mounted there
	}
	return errors.Join(err, fsxfer.RemoveTree(probe))
}

// unmountIDMappedLayers detaches and removes the id-mapped layers under d, if any: their
// tmpfs with them, and one by one what a daemon that mounted them without one left.
func unmountIDMappedLayers(d rootDirs) error {
	if err := unmountOverlay(d.lowerDirs()); err != nil {
		return err
	}
	entries, err := os.ReadDir(d.lowerDirs())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		dir := filepath.Join(d.lowerDirs(), e.Name())
		if err := unmountOverlay(dir); err != nil {
			return err
		}
		if err := os.Remove(dir); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
	}
	return os.Remove(d.lowerDirs())
}
