package fsxfer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/bmatcuk/doublestar/v4"
	"golang.org/x/sys/unix"
)

// TreeOptions select what a Find or Grep walk visits.
type TreeOptions struct {
	MaxDepth  int      // levels below the start directory; 0: no limit but maxWalkDepth; 1: its entries only
	Hidden    bool     // visit names starting with "."; false skips them (and what is below them)
	GitIgnore bool     // honour .gitignore files found on the way (from the start directory down)
	Include   []string // globs a path must match (any of them); none: everything
	Exclude   []string // globs that exclude a path (and, for a directory, what is below it)
}

// globMatch: a pattern without "/" matches the name at any depth (like find -name and
// .gitignore); one with "/" matches the whole path relative to the start directory.
// Patterns are doublestar's: "*", "?", "[…]", "{a,b}" and "**" for any directories.
func globMatch(patterns []string, rel string) bool {
	base := path.Base(rel)
	for _, p := range patterns {
		subject := base
		if strings.Contains(p, "/") {
			subject = rel
		}
		if ok, _ := doublestar.Match(p, subject); ok {
			return true
		}
	}
	return false
}

func checkGlobs(patterns []string) error {
	for _, p := range patterns {
		if p == "" || !doublestar.ValidatePattern(p) {
			return fmt.Errorf("%w: bad glob %q", ErrInvalid, p)
		}
	}
	return nil
}

// dirRef is an open directory shared by the walk and the workers that open files in
// it: the last one to let go closes it.
type dirRef struct {
	fd   int
	refs atomic.Int32
}

func (d *dirRef) hold() { d.refs.Add(1) }

func (d *dirRef) release() {
	if d.refs.Add(-1) == 0 {
		unix.Close(d.fd)
	}
}

// treeEntry is what a walk hands to its visitor. dir stays open during the call; a
// visitor that keeps it must hold it.
type treeEntry struct {
	rel   string
	dir   *dirRef
	name  string
	mode  uint32 // the S_IFMT bits, from the directory entry (or a stat when it has none)
	mount bool   // a directory on another mount: listed, never entered
	ino   uint64 // from the directory entry; 0 when unknown
	st    *unix.Stat_t
}

// stat describes the entry (without following it); nil when it has gone.
func (e *treeEntry) stat() *unix.Stat_t {
	if e.st == nil {
		var st unix.Stat_t
		if unix.Fstatat(e.dir.fd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			return nil
		}
		e.st = &st
	}
	return e.st
}

// errStopWalk ends a walk early without an error.
var errStopWalk = errors.New("stop walk")

// treeWalk walks a lease directory for Find, Grep and Watch. It never follows a
// symlink, never enters another mount, and never enters a directory that does not
// belong to the lease uid (their names may be listed; files are read only by Grep,
// which checks the owner on the open file). Names come sorted, parents before their
// children. The type of an entry comes from the directory itself (d_type), so a walk
// costs no stat per file.
type treeWalk struct {
	f     *FS
	opts  TreeOptions
	visit func(*treeEntry) error
	prune func(rel string) bool
	buf   []byte
}

// walkTree opens the directory p and walks it.
func (f *FS) walkTree(ctx context.Context, p string, opts TreeOptions, visit func(*treeEntry) error, prune func(string) bool) error {
	if err := checkGlobs(opts.Include); err != nil {
		return err
	}
	if err := checkGlobs(opts.Exclude); err != nil {
		return err
	}
	if opts.MaxDepth < 0 {
		return fmt.Errorf("%w: negative depth", ErrInvalid)
	}
	rel, d, err := f.openCleanDir(p)
	if err != nil {
		return err
	}
	dfd, err := unix.Dup(fd(d))
	d.Close()
	if err != nil {
		return wrap("walk", rel, err)
	}
	top := &dirRef{fd: dfd}
	top.hold()
	defer top.release()
	if err := f.onWorkdirMount(dfd); err != nil {
		return wrap("walk", rel, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return wrap("walk", rel, err)
	}
	if rel != "." && int(st.Uid) != f.leaseUID {
		return wrap("walk", rel, ErrForeignLink)
	}
	w := &treeWalk{f: f, opts: opts, visit: visit, prune: prune, buf: make([]byte, 32<<10)}
	err = w.dir(ctx, top, "", 1, nil)
	if errors.Is(err, errStopWalk) {
		err = nil
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		err = wrap("walk", rel, err)
	}
	return err
}

type dirent struct {
	name string
	mode uint32 // S_IFMT bits; 0 when the filesystem does not say
	ino  uint64
}

func (w *treeWalk) dir(ctx context.Context, d *dirRef, rel string, depth int, ign *ignoreSet) error {
	if depth > maxWalkDepth {
		return ErrTooLarge
	}
	ents, err := readDirents(d.fd, w.buf)
	if err != nil {
		return err
	}
	slices.SortFunc(ents, func(a, b dirent) int { return strings.Compare(a.name, b.name) })
	if w.opts.GitIgnore && slices.ContainsFunc(ents, func(e dirent) bool { return e.name == ".gitignore" }) {
		ign = ign.with(parseIgnore(rel, w.f.readSmall(d.fd, ".gitignore", maxIgnoreBytes)))
	}
	for _, de := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !w.opts.Hidden && de.name[0] == '.' {
			continue
		}
		crel := de.name
		if rel != "" {
			crel = rel + "/" + de.name
		}
		e := &treeEntry{rel: crel, dir: d, name: de.name, mode: de.mode, ino: de.ino}
		if e.mode == 0 {
			st := e.stat()
			if st == nil {
				continue // removed since it was listed
			}
			e.mode = st.Mode & unix.S_IFMT
		}
		isDir := e.mode == unix.S_IFDIR
		if ign.ignored(crel, isDir) || (len(w.opts.Exclude) > 0 && globMatch(w.opts.Exclude, crel)) {
			continue
		}
		if !isDir {
			if err := w.visit(e); err != nil {
				return err
			}
			continue
		}
		child, err := w.openChild(d.fd, de.name)
		switch {
		case errors.Is(err, ErrMountPoint):
			e.mount = true
		case errors.Is(err, ErrForeignLink):
			continue // another uid's directory: not listed, not entered
		case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EACCES):
			continue // replaced meanwhile, or unreadable
		case err != nil:
			return err
		}
		err = w.visit(e)
		enter := child != nil && (w.opts.MaxDepth == 0 || depth < w.opts.MaxDepth) && (w.prune == nil || !w.prune(crel))
		if err == nil && enter {
			err = w.dir(ctx, child, crel, depth+1, ign)
		}
		if child != nil {
			child.release()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// openChild opens a subdirectory without following a symlink, refusing another mount
// (ErrMountPoint) and another owner (ErrForeignLink), with one statx on the open
// descriptor.
func (w *treeWalk) openChild(parent int, name string) (*dirRef, error) {
	cfd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	var stx unix.Statx_t
	if err := unix.Statx(cfd, "", unix.AT_EMPTY_PATH, unix.STATX_UID|unix.STATX_MNT_ID, &stx); err != nil {
		unix.Close(cfd)
		return nil, err
	}
	switch {
	case stx.Mnt_id != w.f.mnt:
		unix.Close(cfd)
		return nil, ErrMountPoint
	case int(stx.Uid) != w.f.leaseUID:
		unix.Close(cfd)
		return nil, ErrForeignLink
	}
	d := &dirRef{fd: cfd}
	d.hold()
	return d, nil
}

// readDirents reads the entries of a directory (without "." and ".."), with their
// types: linux_dirent64 is d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
func readDirents(dirfd int, buf []byte) ([]dirent, error) {
	var out []dirent
	for {
		n, err := unix.Getdents(dirfd, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		for off := 0; off+19 <= n; {
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			if reclen == 0 || off+reclen > n {
				break
			}
			ino := binary.NativeEndian.Uint64(buf[off:])
			typ := buf[off+18]
			name := buf[off+19 : off+reclen]
			if i := slices.Index(name, 0); i >= 0 {
				name = name[:i]
			}
			off += reclen
			if s := string(name); s != "." && s != ".." && s != "" {
				out = append(out, dirent{name: s, mode: direntMode(typ), ino: ino})
			}
		}
	}
}

func direntMode(t uint8) uint32 {
	switch t {
	case unix.DT_REG:
		return unix.S_IFREG
	case unix.DT_DIR:
		return unix.S_IFDIR
	case unix.DT_LNK:
		return unix.S_IFLNK
	case unix.DT_FIFO:
		return unix.S_IFIFO
	case unix.DT_SOCK:
		return unix.S_IFSOCK
	case unix.DT_CHR:
		return unix.S_IFCHR
	case unix.DT_BLK:
		return unix.S_IFBLK
	}
	return 0
}

// openFileAt opens the regular file name in dirfd for reading without following a
// symlink and without blocking, and checks it is a regular file of the lease. It
// returns the raw descriptor (no os.File: no poller registration for a short read).
func (f *FS) openFileAt(dirfd int, name string) (int, *unix.Stat_t, error) {
	nfd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(nfd, &st); err != nil {
		unix.Close(nfd)
		return -1, nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != f.leaseUID {
		unix.Close(nfd)
		return -1, nil, ErrNotRegular
	}
	return nfd, &st, nil
}

// readSmall reads a small regular file of the lease in dirfd; nil when it is missing,
// not a regular file, not the lease's, or larger than max.
func (f *FS) readSmall(dirfd int, name string, max int64) []byte {
	nfd, st, err := f.openFileAt(dirfd, name)
	if err != nil {
		return nil
	}
	defer unix.Close(nfd)
	if st.Size > max {
		return nil
	}
	b, _ := readFD(nfd, make([]byte, 0, st.Size), st.Size)
	return b
}

// readFD reads up to n bytes of fd into buf: the file as it was when it was sized
// (one that grew since is read up to n, one that shrank to its end).
func readFD(fd int, buf []byte, n int64) ([]byte, error) {
	buf = slices.Grow(buf[:0], int(n))
	for int64(len(buf)) < n {
		k, err := unix.Read(fd, buf[len(buf):n])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return buf, err
		}
		if k == 0 {
			break
		}
		buf = buf[:len(buf)+k]
	}
	return buf, nil
}

// onWorkdirMount refuses a directory reached across a mount point (os.Root crosses
// them): a bind mount inside the workdir is never listed, read or watched through.
func (f *FS) onWorkdirMount(dirfd int) error {
	if mustMnt(dirfd) != f.mnt {
		return ErrMountPoint
	}
	return nil
}
