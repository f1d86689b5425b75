package fsxfer

import (
	"context"
	"errors"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// maxWalkDepth bounds how deep walks go: every level holds a directory descriptor.
const maxWalkDepth = 1024

type walkEntry struct {
	rel   string // slash-separated, relative to where the walk started
	dirfd int    // the directory holding it
	name  string
	typ   uint32       // the S_IFMT bits
	st    *unix.Stat_t // nil for a regular file of a walk that does not stat them
	mount bool         // a directory on another mount: reported, never entered
}

// walk visits everything below the directory dirfd in name order, depth first, parents
// before children, without following symlinks and without entering another mount than
// mnt. visit returns whether to descend into a directory.
func walk(ctx context.Context, dirfd int, mnt uint64, rel string, depth int, visit func(walkEntry) (bool, error)) error {
	w := walker{visit: visit, mnt: mnt, statFiles: true, buf: make([]byte, 32<<10)}
	return w.dir(ctx, dirfd, rel, depth)
}

// walkNoStat is walk without a stat of regular files, whose type comes from the directory
// entry (e.st is nil for them): for a visitor that opens them and stats the descriptor.
func walkNoStat(ctx context.Context, dirfd int, mnt uint64, visit func(walkEntry) (bool, error)) error {
	w := walker{visit: visit, mnt: mnt, buf: make([]byte, 32<<10)}
	return w.dir(ctx, dirfd, "", 0)
}

type walker struct {
	visit     func(walkEntry) (bool, error)
	mnt       uint64
	statFiles bool
	buf       []byte
}

func (w *walker) dir(ctx context.Context, dirfd int, rel string, depth int) error {
	if depth >= maxWalkDepth {
		return ErrTooLarge
	}
	if _, err := unix.Seek(dirfd, 0, 0); err != nil {
		return err
	}
	ents, err := readDirents(dirfd, w.buf)
	if err != nil {
		return err
	}
	slices.SortFunc(ents, func(a, b dirent) int { return strings.Compare(a.name, b.name) })
	for _, de := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		e := walkEntry{rel: path.Join(rel, de.name), dirfd: dirfd, name: de.name, typ: de.mode}
		if de.mode != unix.S_IFREG || w.statFiles {
			var st unix.Stat_t
			if err := unix.Fstatat(dirfd, de.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				return err
			}
			e.st, e.typ = &st, st.Mode&unix.S_IFMT
		}
		if e.typ != unix.S_IFDIR {
			if _, err := w.visit(e); err != nil {
				return err
			}
			continue
		}
		child, err := openDirAt(dirfd, de.name, w.mnt)
		if errors.Is(err, ErrMountPoint) {
			e.mount = true
		} else if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue // replaced meanwhile
		} else if err != nil {
			return err
		}
		descend, err := w.visit(e)
		if err == nil && descend && !e.mount {
			err = w.dir(ctx, child, e.rel, depth+1)
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
