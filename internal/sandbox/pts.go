package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DefaultMaxPTYs is the PTYs one lease may hold at once (its devpts instance's max).
const DefaultMaxPTYs = 64

// Each lease has a devpts instance of its own, mounted by the daemon at <PTYRoot>/<lease>
// (outside every lease directory, so that no removal of one ever walks into it) and bound on
// /dev/pts and /dev/ptmx in each of the lease's mount namespaces by the helper; the daemon
// opens the masters of the lease's TTY processes from the same instance (OpenPTY). A lease
// that takes every PTY it can takes only its own max of them: other leases keep theirs, and
// the host keeps kernel.pty.reserve (1,024 by default), which instances other than the
// host's own cannot use.

// mountPTS mounts lease id's instance unless it is mounted already, and returns where ("" when
// leases use the host's PTYs).
func (s *Sandbox) mountPTS(id string) (string, error) {
	if s.ptyRoot == "" {
		return "", nil
	}
	dir := filepath.Join(s.ptyRoot, id)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("sandbox: lease %s pts: %w", id, err)
	}
	if mounted, err := devptsAt(dir); err != nil || mounted {
		return dir, err // Provision again: the lease keeps its instance
	}
	opts := fmt.Sprintf("newinstance,ptmxmode=0666,mode=0620,max=%d", s.maxPTYs)
	if err := unix.Mount("devpts", dir, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, opts); err != nil {
		return "", fmt.Errorf("sandbox: lease %s: mount devpts: %w", id, err)
	}
	return dir, nil
}

// removePTS unmounts an instance (lazily: PTYs still open stay usable) and removes its
// mount point.
func removePTS(dir string) error {
	if dir == "" {
		return nil
	}
	if err := unmountPTS(dir); err != nil {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sandbox: remove %s: %w", dir, err)
	}
	return nil
}

// unmountPTS detaches every devpts mounted on dir (a daemon killed between mount and
// unmount can leave one; mounting twice stacks them).
func unmountPTS(dir string) error {
	for {
		mounted, err := devptsAt(dir)
		if err != nil || !mounted {
			return err
		}
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("sandbox: unmount %s: %w", dir, err)
		}
	}
}

// sweepPTS unmounts and removes every instance under root: at start, none belongs to a
// live lease of this run (Provision mounts restored leases' again).
func sweepPTS(root string) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		if err := unmountPTS(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.Remove(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// devptsAt reports whether a devpts is mounted on dir, by the type of the filesystem dir
// resolves to: its parent (the daemon's state dir) is never a devpts, so the type says
// what is mounted on dir itself, at a cost that does not grow with the host's mounts. The
// path resolves in this thread's mount namespace, as the mount and unmount do.
func devptsAt(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); errors.Is(err, unix.ENOENT) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("sandbox: statfs %s: %w", dir, err)
	}
	return st.Type == unix.DEVPTS_SUPER_MAGIC, nil
}

// OpenPTY opens a PTY in lease leaseID's own instance (the host's without one): the master,
// close-on-exec, and its slave, which the caller hands to a TTY command as 0-2. It
// implements process.PTYOpener.
func (s *Sandbox) OpenPTY(leaseID string) (master, slave *os.File, err error) {
	s.mu.Lock()
	le := s.liveLease(leaseID)
	var dir string
	if le != nil {
		dir = le.pts
	}
	s.mu.Unlock()
	if le == nil {
		return nil, nil, fmt.Errorf("%w: %s", ErrUnknownLease, leaseID)
	}
	ptmx := "/dev/ptmx"
	if dir != "" {
		ptmx = filepath.Join(dir, "ptmx")
	}
	mfd, err := unix.Open(ptmx, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOSPC) && dir != "" {
		return nil, nil, fmt.Errorf("%w: all %d PTYs of the lease are open", ErrLimit, s.maxPTYs)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open %s: %w", ptmx, err)
	}
	// unlockpt, then the slave through the master (no path lookup: TIOCGPTPEER, Linux 4.13).
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(mfd)
		return nil, nil, fmt.Errorf("unlockpt: %w", err)
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		unix.Close(mfd)
		return nil, nil, fmt.Errorf("open PTY slave: %w", errno)
	}
	return os.NewFile(uintptr(mfd), ptmx), os.NewFile(sfd, "pty-slave"), nil
}
