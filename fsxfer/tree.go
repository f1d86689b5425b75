package fsxfer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

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

// treeEntry is what a walk hands to its visitor. dirfd stays open only during the call.
type treeEntry struct {
	rel   string
	dirfd int
	name  string
	st    *unix.Stat_t
	mount bool // a directory on another mount: listed, never entered
}

// errStopWalk ends a walk early without an error.
var errStopWalk = errors.New("stop walk")

// treeWalk walks a lease directory for Find and Grep. It never follows a symlink, never
// enters another mount, and skips (neither lists, reads nor enters) entries that do
// not belong to the lease uid: a file planted by root or another lease stays unseen.
// Names come sorted, parents before their children. prune, when set, is asked before
// a directory is entered.
type treeWalk struct {
	f     *FS
	opts  TreeOptions
	mnt   uint64
	visit func(treeEntry) error
	prune func(rel string) bool
	buf   []byte
}

// start opens the directory p and walks it.
func (f *FS) walkTree(ctx context.Context, p string, opts TreeOptions, visit func(treeEntry) error, prune func(string) bool) (string, error) {
	if err := checkGlobs(opts.Include); err != nil {
		return "", err
	}
	if err := checkGlobs(opts.Exclude); err != nil {
		return "", err
	}
	if opts.MaxDepth < 0 {
		return "", fmt.Errorf("%w: negative depth", ErrInvalid)
	}
	rel, err := f.clean(p)
	if err != nil {
		return "", err
	}
	d, err := f.openDir(rel)
	if err != nil {
		return rel, err
	}
	defer d.Close()
	if err := f.onWorkdirMount(fd(d)); err != nil {
		return rel, wrap("walk", rel, err)
	}
	w := &treeWalk{f: f, opts: opts, mnt: f.mnt, visit: visit, prune: prune, buf: make([]byte, 32<<10)}
	err = w.dir(ctx, fd(d), "", 1, nil)
	if errors.Is(err, errStopWalk) {
		err = nil
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		err = wrap("walk", rel, err)
	}
	return rel, err
}

func (w *treeWalk) dir(ctx context.Context, dirfd int, rel string, depth int, ign *ignoreSet) error {
	if depth > maxWalkDepth {
		return ErrTooLarge
	}
	names, err := readNamesBuf(dirfd, w.buf)
	if err != nil {
		return err
	}
	slices.Sort(names)
	if w.opts.GitIgnore && slices.Contains(names, ".gitignore") {
		ign = ign.with(parseIgnore(rel, w.f.readSmall(dirfd, ".gitignore", maxIgnoreBytes)))
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !w.opts.Hidden && name[0] == '.' {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue // removed since it was listed
			}
			return err
		}
		if int(st.Uid) != w.f.leaseUID {
			continue
		}
		crel := name
		if rel != "" {
			crel = rel + "/" + name
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if ign.ignored(crel, isDir) || (len(w.opts.Exclude) > 0 && globMatch(w.opts.Exclude, crel)) {
			continue
		}
		e := treeEntry{rel: crel, dirfd: dirfd, name: name, st: &st}
		enter := isDir && (w.opts.MaxDepth == 0 || depth < w.opts.MaxDepth) && (w.prune == nil || !w.prune(crel))
		child := -1
		if isDir {
			child, err = openDirAt(dirfd, name, w.mnt)
			switch {
			case errors.Is(err, ErrMountPoint):
				e.mount, enter = true, false
			case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP):
				continue // replaced meanwhile
			case errors.Is(err, unix.EACCES):
				enter = false
			case err != nil:
				return err
			}
		}
		err = w.visit(e)
		if err == nil && enter {
			err = w.dir(ctx, child, crel, depth+1, ign)
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

// readNamesBuf is readNames with the caller's buffer.
func readNamesBuf(dirfd int, buf []byte) ([]string, error) {
	var names []string
	for {
		n, err := unix.ReadDirent(dirfd, buf)
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// openFileAt opens the regular file name in dirfd for reading without following a
// symlink and without blocking, and checks it is a regular file of the lease.
func (f *FS) openFileAt(dirfd int, name string) (*os.File, *unix.Stat_t, error) {
	nfd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(nfd, &st); err != nil {
		unix.Close(nfd)
		return nil, nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != f.leaseUID {
		unix.Close(nfd)
		return nil, nil, ErrNotRegular
	}
	return os.NewFile(uintptr(nfd), name), &st, nil
}

// readSmall reads a small regular file of the lease in dirfd; nil when it is missing,
// not a regular file, not the lease's, or larger than max.
func (f *FS) readSmall(dirfd int, name string, max int64) []byte {
	h, st, err := f.openFileAt(dirfd, name)
	if err != nil {
		return nil
	}
	defer h.Close()
	if st.Size > max {
		return nil
	}
	b := make([]byte, st.Size)
	n, _ := h.ReadAt(b, 0)
	return b[:n]
}

// onWorkdirMount refuses a directory reached across a mount point (os.Root crosses
// them): a bind mount inside the workdir is never listed, read or watched through.
func (f *FS) onWorkdirMount(dirfd int) error {
	if mustMnt(dirfd) != f.mnt {
		return ErrMountPoint
	}
	return nil
}
