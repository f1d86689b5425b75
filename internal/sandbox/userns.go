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

// rootLeases says whether helper can run a lease as root in a user namespace: only the C
// helper can (setns into a user namespace takes a single-threaded process; every Go
// binary carries build information, a C one none).
func rootLeases(helper string) bool {
	_, err := buildinfo.ReadFile(helper)
	return err != nil
}

// newLeaseUserNS makes a lease's user namespace, mapping 0 onto uid and gid. The daemon
// cannot enter one itself (the kernel takes only single-threaded processes into a user
// namespace), and cloning a child into one costs a full fork of the daemon (no vfork with
// CLONE_NEWUSER): the C helper makes it instead (`sidecar-init userns`), the daemon writes
// its maps from outside and opens it, and the helper exits.
func newLeaseUserNS(helper string, uid, gid int) (*os.File, error) {
	var stderr bytes.Buffer
	cmd := &exec.Cmd{Path: helper, Args: []string{helper, "userns"}, Env: []string{}, Stderr: &stderr}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("sandbox: user namespace: %w", err)
	}
	ready := make([]byte, 1)
	if _, err := io.ReadFull(out, ready); err != nil || ready[0] != 'R' {
		in.Close()
		_ = cmd.Wait() // stderr is all there once it returns
		return nil, fmt.Errorf("sandbox: user namespace (a systemd unit's RestrictNamespaces= must allow user): %s", strings.TrimSpace(stderr.String()))
	}
	defer func() {
		in.Close() // the helper exits at end of file
		_ = cmd.Wait()
	}()
	proc := "/proc/" + strconv.Itoa(cmd.Process.Pid)
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
// layers, so unmountIDMappedLayers may detach these as soon as it is mounted.
func mountIDMappedLayers(d rootDirs, layers []string, userns *os.File) ([]string, error) {
	if err := unmountIDMappedLayers(d); err != nil { // what a crash in between left
		return nil, err
	}
	if err := os.Mkdir(d.lowerDirs(), 0o700); err != nil {
		return nil, err
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
	ns, err := newLeaseUserNS(s.helper, 65534, 65534)
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

// unmountIDMappedLayers detaches and removes the id-mapped layers under d, if any.
func unmountIDMappedLayers(d rootDirs) error {
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
