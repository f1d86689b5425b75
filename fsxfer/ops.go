package fsxfer

import (
	"errors"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// dirPerm is the mode of directories created for the lease.
const dirPerm = 0o755

// Mkdir creates the directory at path and its missing parents, owned by the lease uid.
// An existing directory is fine; an existing non-directory is ErrNotDir.
func (f *FS) Mkdir(p string) error {
	rel, err := f.clean(p)
	if err != nil {
		return err
	}
	return f.mkdirAll(rel)
}

func (f *FS) mkdirAll(rel string) error {
	if rel == "." {
		return nil
	}
	prefix := ""
	for e := range strings.SplitSeq(rel, "/") {
		prefix = path.Join(prefix, e)
		if err := f.mkdirOne(prefix); err != nil {
			return wrap("mkdir", prefix, err)
		}
	}
	return nil
}

// mkdirOne creates one directory (its parent exists) and gives it to the lease uid by
// descriptor; an existing directory, or a symlink to one inside the workdir, is fine.
func (f *FS) mkdirOne(rel string) error {
	d, base, err := f.openParent(rel)
	if err != nil {
		return err
	}
	defer d.Close()
	err = unix.Mkdirat(fd(d), base, dirPerm)
	if errors.Is(err, unix.EEXIST) {
		st, err := f.root.Stat(rel)
		if err != nil {
			return err
		}
		if !st.IsDir() {
			return ErrNotDir
		}
		return nil
	}
	if err != nil {
		return err
	}
	nd, err := openDirAt(fd(d), base, mustMnt(fd(d)))
	if err != nil {
		return err
	}
	defer unix.Close(nd)
	if err := unix.Fchmod(nd, dirPerm); err != nil { // whatever the daemon's umask
		return err
	}
	if f.cfg.UID >= 0 {
		return unix.Fchown(nd, f.cfg.UID, f.cfg.GID)
	}
	return nil
}

// mustMnt is the mount ID of the directory fd, 0 when it cannot be read (then nothing
// matches and openDirAt refuses: failing closed).
func mustMnt(dirfd int) uint64 {
	id, err := identify(dirfd)
	if err != nil {
		return 0
	}
	return id.mnt
}

// Remove removes the file, symlink or directory at path (the link itself, never its
// target). A non-empty directory needs recursive (ErrNotEmpty otherwise); a recursive
// removal never follows symlinks and never crosses a mount point (ErrMountPoint, with the
// mount left untouched). The workdir itself cannot be removed (ErrInvalid).
func (f *FS) Remove(p string, recursive bool) error {
	rel, err := f.clean(p)
	if err != nil {
		return err
	}
	if rel == "." {
		return wrap("remove", rel, ErrInvalid)
	}
	d, base, err := f.openParent(rel)
	if err != nil {
		return err
	}
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstatat(fd(d), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return wrap("remove", rel, err)
	}
	defer f.meter.invalidate() // freed space shows at the next usage call
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return wrap("remove", rel, unix.Unlinkat(fd(d), base, 0))
	}
	if !recursive {
		return wrap("remove", rel, unix.Unlinkat(fd(d), base, unix.AT_REMOVEDIR))
	}
	// Refuse up front a tree holding a mount, so that nothing of it is removed.
	if err := f.refuseMounts(fd(d), base); err != nil {
		return wrap("remove", rel, err)
	}
	return wrap("remove", rel, removeAt(fd(d), base))
}

// Move renames from to to, both inside the workdir; the destination's parent must exist.
// The last element of either is never followed. Replacing follows rename(2): a file
// replaces a file, an empty directory an empty directory.
func (f *FS) Move(from, to string) error {
	src, err := f.clean(from)
	if err != nil {
		return err
	}
	dst, err := f.clean(to)
	if err != nil {
		return err
	}
	if src == "." || dst == "." {
		return wrap("move", src, ErrInvalid)
	}
	sd, sbase, err := f.openParent(src)
	if err != nil {
		return err
	}
	defer sd.Close()
	dd, dbase, err := f.openParent(dst)
	if err != nil {
		return err
	}
	defer dd.Close()
	return wrap("move", src, unix.Renameat(fd(sd), sbase, fd(dd), dbase))
}

// refuseMounts fails with ErrMountPoint when base in the directory dirfd is or holds a
// mount point, and with the error met when it cannot tell (the tree changing under the
// check): either way nothing of the tree is removed.
func (f *FS) refuseMounts(dirfd int, base string) error {
	if statxMountIDs() {
		return refuseMounts(dirfd, base)
	}
	dir, err := fdPath(dirfd)
	if err != nil {
		return nil // the walk still refuses to cross a mount
	}
	if mounts, err := mountsUnder(path.Join(dir, base)); err != nil || len(mounts) > 0 {
		return ErrMountPoint
	}
	return nil
}

// fdPath is the kernel's idea of where an open directory is, for the mountinfo check.
func fdPath(dirfd int) (string, error) {
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(dirfd))
}
