package fsxfer

import (
	"path/filepath"

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

// mountsUnder reports the mounts at or below the absolute path dir in the calling thread's
// mount namespace, where removal acts (mountinfo reads /proc/thread-self; /proc/self is the
// main thread's, which may have been left in another namespace).
func mountsUnder(dir string) ([]*mountinfo.Info, error) {
	return mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Clean(dir)))
}
