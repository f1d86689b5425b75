package fsxfer

import (
	"errors"
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// RemoveTree removes the directory tree at the absolute path dir without following
// symlinks and without ever descending into a mount point (it fails instead, leaving the
// mount and what lies under it untouched). Lease directories are removed with it.
//
// A tree holding a mount point is refused whole, before anything is removed: the tree is
// read first and every entry's mount ID compared (refuseMounts; the calling thread's
// mountinfo on kernels whose statx gives none). The walk itself compares mount IDs of
// every directory it enters as well, for mounts that appear meanwhile. Removal works on
// descriptors (openat/unlinkat with O_NOFOLLOW), so swapping a directory for a symlink
// mid-walk cannot redirect it. A missing dir is not an error.
func RemoveTree(dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || dir == "/" {
		return fmt.Errorf("fsxfer: remove tree %q: %w: want a clean absolute path", dir, ErrInvalid)
	}
	parent, err := unix.Open(filepath.Dir(dir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fsxfer: remove tree %q: %w", dir, err)
	}
	defer unix.Close(parent)
	if err := refuseMountsUnder(parent, dir); err != nil {
		return fmt.Errorf("fsxfer: remove tree %q: %w", dir, err)
	}
	if err := removeAt(parent, filepath.Base(dir)); err != nil {
		return fmt.Errorf("fsxfer: remove tree %q: %w", dir, err)
	}
	return nil
}

// refuseMountsUnder is refuseMounts for dir, the absolute path of an entry of the
// directory parent.
func refuseMountsUnder(parent int, dir string) error {
	if statxMountIDs() {
		return refuseMounts(parent, filepath.Base(dir))
	}
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		return fmt.Errorf("%w: %q", ErrMountPoint, mounts[0].Mountpoint)
	}
	return nil
}

// maxRemoveRestarts bounds how often a directory that refills while it is being emptied
// (a process still writing) is walked again before removal gives up.
const maxRemoveRestarts = 100

// removeAt removes name in the directory parent: a file or symlink is unlinked, a
// directory is emptied depth first and removed. It holds one directory descriptor at a
// time whatever the depth: climbing back goes through ".." and checks that it arrives
// where it came from, so a directory moved away mid-walk makes it fail, never stray.
func removeAt(parent int, name string) error {
	err := unix.Unlinkat(parent, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return classifyUnlink(name, err)
	}
	top, err := identify(parent)
	if err != nil {
		return err
	}
	for restart := 0; ; restart++ {
		cur, err := openDirAt(parent, name, top.mnt)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := emptyTree(cur, top.mnt); err != nil {
			return err
		}
		err = unix.Unlinkat(parent, name, unix.AT_REMOVEDIR)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.ENOTEMPTY) || restart >= maxRemoveRestarts {
			return classifyUnlink(name, err)
		}
	}
}

// openDirAt opens the directory name under parent without following a symlink and
// checks it is on mount mnt.
func openDirAt(parent int, name string, mnt uint64) (int, error) {
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	id, err := identify(fd)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	if id.mnt != mnt {
		unix.Close(fd)
		return -1, fmt.Errorf("%w: %q", ErrMountPoint, name)
	}
	return fd, nil
}

type removeFrame struct {
	name   string // of the directory being emptied, in its parent
	parent dirID
}

// emptyTree removes everything below the directory open as fd and closes fd.
func emptyTree(fd int, mnt uint64) error {
	cur := fd
	defer func() { unix.Close(cur) }()
	var stack []removeFrame
	buf := make([]byte, 32<<10)
	restarts := 0
	for {
		child, err := unlinkEntries(cur, buf)
		if err != nil {
			return err
		}
		if child != "" { // descend
			id, err := identify(cur)
			if err != nil {
				return err
			}
			next, err := openDirAt(cur, child, mnt)
			if errors.Is(err, unix.ENOENT) {
				continue // gone meanwhile; read cur again
			}
			if err != nil {
				return err
			}
			stack = append(stack, removeFrame{name: child, parent: id})
			unix.Close(cur)
			cur = next
			continue
		}
		if len(stack) == 0 {
			return nil
		}
		top := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		up, err := unix.Openat(cur, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		unix.Close(cur)
		cur = up
		if id, err := identify(up); err != nil || id != top.parent {
			return fmt.Errorf("%w: directory %q moved during removal", ErrInvalid, top.name)
		}
		err = unix.Unlinkat(cur, top.name, unix.AT_REMOVEDIR)
		switch {
		case err == nil || errors.Is(err, unix.ENOENT):
		case errors.Is(err, unix.ENOTEMPTY) && restarts < maxRemoveRestarts:
			restarts++ // refilled meanwhile: the next read of cur finds it again
		default:
			return classifyUnlink(top.name, err)
		}
	}
}

// unlinkEntries unlinks every non-directory in the directory fd, reading it from the
// start. It returns the name of the first subdirectory it meets, or "" once the directory
// holds nothing but what it could not see yet.
func unlinkEntries(fd int, buf []byte) (subdir string, err error) {
	if _, err := unix.Seek(fd, 0, 0); err != nil {
		return "", err
	}
	names := make([]string, 0, 64)
	for {
		n, err := unix.ReadDirent(fd, buf)
		if err != nil {
			return "", err
		}
		if n <= 0 {
			return "", nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names[:0])
		for _, name := range names {
			err := unix.Unlinkat(fd, name, 0)
			switch {
			case err == nil || errors.Is(err, unix.ENOENT):
			case errors.Is(err, unix.EISDIR):
				return name, nil
			default:
				return "", classifyUnlink(name, err)
			}
		}
	}
}

func classifyUnlink(name string, err error) error {
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%w: %q", ErrMountPoint, name)
	}
	return fmt.Errorf("unlink %q: %w", name, err)
}
