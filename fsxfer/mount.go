package fsxfer

import (
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"sync"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// dirID identifies a directory: the mount it is on and its inode. Two descriptors with
// the same dirID refer to the same directory; a different mount ID means a mount point
// was crossed (st_dev alone misses a bind mount of the same filesystem).
type dirID struct {
	mnt uint64
	dev uint64
	ino uint64
}

func identify(fd int) (dirID, error) {
	var stx unix.Statx_t
	err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_MNT_ID, &stx)
	if err != nil {
		return dirID{}, err
	}
	return dirID{
		mnt: stx.Mnt_id,
		dev: unix.Mkdev(stx.Dev_major, stx.Dev_minor),
		ino: stx.Ino,
	}, nil
}

// statxMountIDs reports whether statx gives mount IDs (Linux 5.8 and later). Without
// them a mount point is found in mountinfo instead.
var statxMountIDs = sync.OnceValue(func() bool {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, "/", 0, unix.STATX_MNT_ID, &stx)
	return err == nil && stx.Mask&unix.STATX_MNT_ID != 0
})

// refuseMounts fails with ErrMountPoint when the entry name in the directory parent is a
// mount point or holds one, in the calling thread's mount namespace (the one removal acts
// in). It reads the tree, never the mount table: the cost follows the tree's size, not
// the number of mounts on the host (one or more per lease). Every entry's mount ID is
// compared with parent's: a directory, file or symlink mounted over differs. It holds one
// directory descriptor at a time whatever the depth, climbing back through ".." and
// checking that it arrives where it came from. Entries that vanish or change type
// meanwhile are skipped: the removal walk checks mount IDs again as it goes.
func refuseMounts(parent int, name string) error {
	top, err := identify(parent)
	if err != nil {
		return err
	}
	var stx unix.Statx_t
	err = unix.Statx(parent, name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_MNT_ID, &stx)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return err
	case stx.Mnt_id != top.mnt:
		return fmt.Errorf("%w: %q", ErrMountPoint, name)
	case uint32(stx.Mode)&unix.S_IFMT != unix.S_IFDIR:
		return nil
	}
	fd, err := openDirAt(parent, name, top.mnt)
	if skippable(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return scanForMounts(fd, name, top.mnt)
}

// scanFrame is a directory being scanned: where it is and the subdirectories left to enter.
type scanFrame struct {
	id      dirID
	rel     string
	subdirs []string
}

// scanForMounts checks the tree below the directory open as fd (rel names it in errors)
// for entries on another mount than mnt, and closes fd.
func scanForMounts(fd int, rel string, mnt uint64) error {
	cur := fd
	defer func() { unix.Close(cur) }()
	buf := make([]byte, 32<<10)
	var stack []scanFrame
	for {
		frame, err := scanDir(cur, rel, mnt, buf)
		if err != nil {
			return err
		}
		stack = append(stack, frame)
		next, err := nextDir(&stack, &cur, mnt)
		if err != nil || next == "" {
			return err
		}
		rel = next
	}
}

// scanDir checks the entries of the directory cur and lists its subdirectories.
func scanDir(cur int, rel string, mnt uint64, buf []byte) (scanFrame, error) {
	id, err := identify(cur)
	if err != nil {
		return scanFrame{}, err
	}
	entries, err := readDirents(cur, buf)
	if err != nil {
		return scanFrame{}, err
	}
	frame := scanFrame{id: id, rel: rel}
	for _, e := range entries {
		if e.mode == unix.S_IFDIR {
			frame.subdirs = append(frame.subdirs, e.name)
			continue // openDirAt checks its mount ID on the way in
		}
		var stx unix.Statx_t
		err := unix.Statx(cur, e.name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE|unix.STATX_MNT_ID, &stx)
		switch {
		case errors.Is(err, unix.ENOENT):
		case err != nil:
			return scanFrame{}, err
		case stx.Mnt_id != mnt:
			return scanFrame{}, fmt.Errorf("%w: %q", ErrMountPoint, path.Join(rel, e.name))
		case uint32(stx.Mode)&unix.S_IFMT == unix.S_IFDIR: // the filesystem gave no type
			frame.subdirs = append(frame.subdirs, e.name)
		}
	}
	return frame, nil
}

// nextDir moves *cur to the next directory to scan, depth first, and returns its
// lease-relative name ("" once the whole tree is done). Finished directories are left
// through "..", which must lead back to the directory the frame below recorded.
func nextDir(stack *[]scanFrame, cur *int, mnt uint64) (string, error) {
	for len(*stack) > 0 {
		top := &(*stack)[len(*stack)-1]
		for len(top.subdirs) > 0 {
			name := top.subdirs[0]
			top.subdirs = top.subdirs[1:]
			next, err := openDirAt(*cur, name, mnt)
			if skippable(err) {
				continue
			}
			if errors.Is(err, ErrMountPoint) {
				return "", fmt.Errorf("%w: %q", ErrMountPoint, path.Join(top.rel, name))
			}
			if err != nil {
				return "", err
			}
			unix.Close(*cur)
			*cur = next
			return path.Join(top.rel, name), nil
		}
		*stack = (*stack)[:len(*stack)-1]
		if len(*stack) == 0 {
			return "", nil
		}
		up, err := unix.Openat(*cur, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		unix.Close(*cur)
		*cur = up
		if id, err := identify(up); err != nil || id != (*stack)[len(*stack)-1].id {
			return "", fmt.Errorf("%w: directory %q moved during the mount check", ErrInvalid, top.rel)
		}
	}
	return "", nil
}

// skippable: an entry removed or replaced by a non-directory since it was listed.
func skippable(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

// mountsUnder reports the mounts at or below the absolute path dir in the calling thread's
// mount namespace, where removal acts (mountinfo reads /proc/thread-self; /proc/self is the
// main thread's, which may have been left in another namespace). It reads the whole mount
// table: only for kernels whose statx gives no mount IDs.
func mountsUnder(dir string) ([]*mountinfo.Info, error) {
	return mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Clean(dir)))
}
