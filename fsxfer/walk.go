package fsxfer

import (
	"context"
	"errors"
	"path"
	"slices"

	"golang.org/x/sys/unix"
)

// maxWalkDepth bounds how deep walks go: every level holds a directory descriptor.
const maxWalkDepth = 1024

type walkEntry struct {
	rel   string // slash-separated, relative to where the walk started
	dirfd int    // the directory holding it
	name  string
	st    *unix.Stat_t
	mount bool // a directory on another mount: reported, never entered
}

// walk visits everything below the directory dirfd in name order, depth first, parents
// before children, without following symlinks and without entering another mount than
// mnt. visit returns whether to descend into a directory.
func walk(ctx context.Context, dirfd int, mnt uint64, rel string, depth int, visit func(walkEntry) (bool, error)) error {
	if depth >= maxWalkDepth {
		return ErrTooLarge
	}
	names, err := readNames(dirfd, 0)
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return err
		}
		e := walkEntry{rel: path.Join(rel, name), dirfd: dirfd, name: name, st: &st}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if _, err := visit(e); err != nil {
				return err
			}
			continue
		}
		child, err := openDirAt(dirfd, name, mnt)
		if errors.Is(err, ErrMountPoint) {
			e.mount = true
		} else if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue // replaced meanwhile
		} else if err != nil {
			return err
		}
		descend, err := visit(e)
		if err == nil && descend && !e.mount {
			err = walk(ctx, child, mnt, e.rel, depth+1, visit)
		}
		if child >= 0 {
			unix.Close(child)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
