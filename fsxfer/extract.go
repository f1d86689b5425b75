package fsxfer

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// ArchiveStats counts what an archive held (hard links count as files).
type ArchiveStats struct {
	Files, Dirs, Symlinks int
	Bytes                 int64
}

// zstdMaxWindow bounds the memory a zstd stream may ask the decoder for.
const zstdMaxWindow = 32 << 20

// ExtractTar extracts the tar stream r (encoding "", "gzip" or "zstd") into the existing
// directory dir, with Docker's archive PUT semantics: entries land under dir, existing
// files are replaced, existing directories are merged into.
//
// Everything is first extracted into a hidden staging directory inside dir, then moved
// into place; on any refusal the staging directory is removed and nothing of the archive
// remains. Refused: absolute names and names with ".." (ErrOutside), symlinks pointing
// outside the workdir (ErrOutside), hard links to anything but a regular file extracted
// earlier from the same archive (ErrOutside, ErrNotRegular), device, FIFO and other
// special entries (ErrNotRegular), more than Config.MaxArchiveEntries entries
// (ErrTooLarge), over-long names (ErrNameTooLong), a directory where a file is, or the
// reverse (ErrIsDir, ErrNotDir). setuid, setgid and sticky bits are dropped, everything
// belongs to the lease uid, and the quota is enforced while writing, which stops a
// decompression bomb.
func (f *FS) ExtractTar(ctx context.Context, dir string, r io.Reader, encoding string) (ArchiveStats, error) {
	rel, err := f.clean(dir)
	if err != nil {
		return ArchiveStats{}, err
	}
	src, closeSrc, err := decompress(r, encoding)
	if err != nil {
		return ArchiveStats{}, wrap("extract", rel, err)
	}
	defer closeSrc()
	if err := f.quotaBase(ctx); err != nil {
		return ArchiveStats{}, wrap("extract", rel, err)
	}
	d, err := f.openDir(rel)
	if err != nil {
		return ArchiveStats{}, err
	}
	defer d.Close()
	st, err := f.newStaging(d, rel)
	if err != nil {
		return ArchiveStats{}, wrap("extract", rel, err)
	}
	kept := int64(0)
	defer func() { st.close(kept) }()

	// tar reads a 512-byte header, then each small file, on its own: from a buffer, not
	// each from the request body.
	stats, err := st.extract(ctx, tar.NewReader(bufio.NewReaderSize(src, tarBufSize)))
	if err != nil {
		return ArchiveStats{}, wrap("extract", rel, err)
	}
	// No fsync here: the staging directory makes the tree appear whole or not at all to
	// readers and across a daemon crash (the page cache survives a kill -9). Surviving a
	// host crash would need a syncfs, which waits for every lease's dirty data, or an
	// fsync per file, which costs milliseconds each; neither is worth it for a tree copy.
	if err := f.checkMerge(ctx, st.fd, fd(d)); err != nil {
		return ArchiveStats{}, wrap("extract", rel, err)
	}
	if err := mergeInto(st.fd, fd(d)); err != nil {
		return ArchiveStats{}, wrap("extract", rel, err)
	}
	kept = st.res.bytes
	return stats, nil
}

func decompress(r io.Reader, encoding string) (io.Reader, func(), error) {
	switch strings.ToLower(encoding) {
	case "", "identity":
		return r, func() {}, nil
	case "gzip", "x-gzip":
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: gzip: %v", ErrInvalid, err)
		}
		return z, func() { z.Close() }, nil
	case "zstd":
		z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			return nil, nil, fmt.Errorf("%w: zstd: %v", ErrInvalid, err)
		}
		return z, z.Close, nil
	}
	return nil, nil, fmt.Errorf("%w: unsupported encoding %q", ErrInvalid, encoding)
}

// staging is the hidden directory an archive is extracted into.
type staging struct {
	f      *FS
	parent int    // the target directory
	name   string // of the staging directory in parent
	fd     int
	root   *os.Root // at the staging directory: entries cannot leave it
	relDir string   // the target directory, relative to the workdir
	res    *reservation
	dirs   []stagedDir
	size   int64 // logical bytes extracted: holes cost no disk, but a bomb of them still stops at the quota
	// What this archive has created so far, to save system calls on the common case of
	// new names in known directories (a tar of 10,000 small files is syscall bound).
	made map[string]bool // name → is a directory
	// Open directories of the staging tree by name, so that a file is created with one
	// openat instead of a walk from the root. They stay inside the staging tree: a
	// lease process moving one elsewhere moves it inside its own workdir.
	dirFds map[string]*os.File
}

// maxDirFds bounds the descriptors the directory cache holds.
const maxDirFds = 64

func (s *staging) dirFd(dir string) (int, error) {
	if d, ok := s.dirFds[dir]; ok {
		return fd(d), nil
	}
	d, err := s.root.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, err
	}
	if len(s.dirFds) >= maxDirFds {
		s.dropDirFds()
	}
	if s.dirFds == nil {
		s.dirFds = map[string]*os.File{}
	}
	s.dirFds[dir] = d
	return fd(d), nil
}

func (s *staging) dropDirFds() {
	for _, d := range s.dirFds {
		d.Close()
	}
	s.dirFds = nil
}

type stagedDir struct {
	name  string
	mode  uint32
	mtime time.Time
}

func (f *FS) newStaging(d *os.File, rel string) (*staging, error) {
	var rnd [12]byte
	_, _ = rand.Read(rnd[:])
	name := tempPrefix + hex.EncodeToString(rnd[:])
	if err := unix.Mkdirat(fd(d), name, 0o700); err != nil {
		return nil, err
	}
	s := &staging{f: f, parent: fd(d), name: name, fd: -1, relDir: rel, made: map[string]bool{".": true}}
	var err error
	if s.fd, err = openDirAt(fd(d), name, mustMnt(fd(d))); err != nil {
		_ = unix.Unlinkat(fd(d), name, unix.AT_REMOVEDIR)
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(s.fd, &st); err != nil {
		s.close(0)
		return nil, err
	}
	s.res = f.meter.begin(keyOf(&st), 0)
	// The root is opened by a path through the workdir root; check it is the directory
	// just made (a lease process could have renamed things in between).
	if s.root, err = f.root.OpenRoot(path.Join(rel, name)); err != nil {
		s.close(0)
		return nil, err
	}
	rst, err := s.root.Stat(".")
	if err != nil {
		s.close(0)
		return nil, err
	}
	if sys, ok := rst.Sys().(*syscall.Stat_t); !ok || uint64(sys.Dev) != st.Dev || sys.Ino != st.Ino {
		s.close(0)
		return nil, fmt.Errorf("%w: staging directory moved", ErrInvalid)
	}
	return s, nil
}

// close removes what is left of the staging directory (all of it after a failure,
// the emptied directory after a merge) and ends the quota reservation.
func (s *staging) close(kept int64) {
	s.dropDirFds()
	if s.root != nil {
		s.root.Close()
	}
	if s.fd >= 0 {
		unix.Close(s.fd)
	}
	if err := removeAt(s.parent, s.name); err != nil {
		s.f.log.Warn("fsxfer: staging directory left behind", "dir", s.relDir, "name", s.name, "err", err)
	}
	if s.res != nil {
		s.res.end(kept)
	}
}

func (s *staging) extract(ctx context.Context, tr *tar.Reader) (ArchiveStats, error) {
	var stats ArchiveStats
	for entries := 0; ; entries++ {
		if err := ctx.Err(); err != nil {
			return stats, err
		}
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return stats, fmt.Errorf("%w: tar: %v", ErrInvalid, err)
		}
		if entries >= s.f.cfg.MaxArchiveEntries {
			return stats, fmt.Errorf("%w: more than %d archive entries", ErrTooLarge, s.f.cfg.MaxArchiveEntries)
		}
		if err := s.entry(ctx, hdr, tr, &stats); err != nil {
			return stats, fmt.Errorf("entry %q: %w", shorten(hdr.Name), err)
		}
	}
	return stats, s.finishDirs()
}

func (s *staging) entry(ctx context.Context, hdr *tar.Header, tr *tar.Reader, stats *ArchiveStats) error {
	name, err := cleanPath(hdr.Name, s.f.cfg.MaxNameBytes)
	if err != nil {
		return err
	}
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeDir:
		if name == "." {
			return nil // the target directory itself: it exists and keeps its mode
		}
		if err := s.mkdirs(name); err != nil {
			return err
		}
		s.dirs = append(s.dirs, stagedDir{name: name, mode: uint32(hdr.Mode) & 0o777, mtime: hdr.ModTime})
		stats.Dirs++
		return nil
	case tar.TypeReg, tar.TypeGNUSparse: // the reader turns TypeRegA into TypeReg
		if err := s.prepare(name); err != nil {
			return err
		}
		if err := s.file(ctx, name, hdr, tr); err != nil {
			return err
		}
		stats.Files++
		stats.Bytes += hdr.Size
		return nil
	case tar.TypeSymlink:
		if err := s.checkLinkTarget(name, hdr.Linkname); err != nil {
			return err
		}
		if err := s.prepare(name); err != nil {
			return err
		}
		if err := s.root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		if s.f.cfg.UID >= 0 {
			if err := s.root.Lchown(name, s.f.cfg.UID, s.f.cfg.GID); err != nil {
				return err
			}
		}
		stats.Symlinks++
		return nil
	case tar.TypeLink:
		target, err := cleanPath(hdr.Linkname, s.f.cfg.MaxNameBytes)
		if err != nil {
			return err
		}
		st, err := s.root.Lstat(target)
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: hard link to %q, not in the archive", ErrOutside, shorten(hdr.Linkname))
		}
		if err != nil {
			return err
		}
		if !st.Mode().IsRegular() {
			return fmt.Errorf("%w: hard link to %q", ErrNotRegular, shorten(hdr.Linkname))
		}
		if err := s.prepare(name); err != nil {
			return err
		}
		if err := s.root.Link(target, name); err != nil {
			return err
		}
		stats.Files++
		return nil
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return fmt.Errorf("%w: special file (type %q)", ErrNotRegular, hdr.Typeflag)
	}
	return fmt.Errorf("%w: unsupported tar entry type %q", ErrInvalid, hdr.Typeflag)
}

// checkLinkTarget refuses symlinks that are absolute or whose target, read from where the
// link will be, leaves the workdir.
func (s *staging) checkLinkTarget(name, target string) error {
	if target == "" || strings.IndexByte(target, 0) >= 0 || len(target) > s.f.cfg.MaxNameBytes {
		return fmt.Errorf("%w: symlink target", ErrInvalid)
	}
	if strings.HasPrefix(target, "/") {
		return fmt.Errorf("%w: absolute symlink target %q", ErrOutside, shorten(target))
	}
	resolved := path.Join(s.relDir, path.Dir(name), target)
	if resolved == ".." || strings.HasPrefix(resolved, "../") {
		return fmt.Errorf("%w: symlink target %q", ErrOutside, shorten(target))
	}
	return nil
}

// mkdirs creates name and its parents in the staging directory.
func (s *staging) mkdirs(name string) error {
	if s.made[name] {
		return nil
	}
	if err := s.root.MkdirAll(name, 0o700); err != nil {
		if errors.Is(err, unix.ENOTDIR) || errors.Is(err, os.ErrExist) {
			return fmt.Errorf("%w: %q is not a directory", ErrNotDir, shorten(name))
		}
		return err
	}
	for p := name; p != "."; p = path.Dir(p) {
		s.made[p] = true
	}
	return s.res.grow(4096)
}

// prepare makes the parents of a non-directory entry and clears a previous entry of the
// same name (a later entry of a tar replaces an earlier one).
func (s *staging) prepare(name string) error {
	if dir := path.Dir(name); dir != "." {
		if err := s.mkdirs(dir); err != nil {
			return err
		}
	}
	if _, seen := s.made[name]; !seen {
		s.made[name] = false
		return nil
	}
	st, err := s.root.Lstat(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if st.IsDir() {
		return fmt.Errorf("%w: %q", ErrIsDir, shorten(name))
	}
	return s.root.Remove(name)
}

func (s *staging) file(ctx context.Context, name string, hdr *tar.Header, tr *tar.Reader) error {
	s.size += hdr.Size
	if q := s.f.cfg.QuotaBytes; q > 0 && s.size > q {
		return fmt.Errorf("%w: archive holds more than the quota", ErrQuota)
	}
	dirfd, err := s.dirFd(path.Dir(name))
	if err != nil {
		return err
	}
	// Created with its final mode where the umask leaves it whole (no fchmod then): the
	// staging directory keeps it from everyone meanwhile. A bare descriptor, not an
	// os.File: no poller registration and no fcntl calls for a file written once.
	mode := uint32(hdr.Mode) & 0o777
	nfd, err := unix.Openat(dirfd, path.Base(name), unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return err
	}
	defer unix.Close(nfd)
	if _, err := copyIn(ctx, rawFD(nfd), 0, tr, s.res, nil); err != nil {
		return err
	}
	if mode&processUmask() != 0 {
		if err := unix.Fchmod(nfd, mode); err != nil {
			return err
		}
	}
	if s.f.cfg.UID >= 0 {
		if err := unix.Fchown(nfd, s.f.cfg.UID, s.f.cfg.GID); err != nil {
			return err
		}
	}
	return setMtime(nfd, hdr.ModTime)
}

// rawFD is a descriptor copyIn writes to directly.
type rawFD int

func (r rawFD) WriteAt(b []byte, off int64) (int, error) {
	n := 0
	for n < len(b) {
		k, err := unix.Pwrite(int(r), b[n:], off+int64(n))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, err
		}
		if k == 0 {
			return n, io.ErrShortWrite
		}
		n += k
	}
	return n, nil
}

func (r rawFD) Truncate(size int64) error { return unix.Ftruncate(int(r), size) }

func (r rawFD) Fd() uintptr { return uintptr(r) }

// processUmask is the daemon's umask (from /proc/self/status: reading it with umask(2)
// would change it for a moment under other threads creating files). When it cannot be
// read, every bit counts as masked, so modes are always set explicitly.
var processUmask = sync.OnceValue(func() uint32 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0o777
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			if m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32); err == nil {
				return uint32(m)
			}
		}
	}
	return 0o777
})

// finishDirs gives the staged directories their modes, owner and times, deepest first
// so that setting a parent's mtime comes after its children were made. Every directory
// in the staging tree was made by mkdirs (nobody else can write there: it is the daemon's,
// mode 0700), so s.made lists them all without a walk.
func (s *staging) finishDirs() error {
	var all []string
	for name, isDir := range s.made {
		if isDir && name != "." {
			all = append(all, name)
		}
	}
	// Deepest first; among equals by name, for a reproducible order.
	slices.SortFunc(all, func(a, b string) int {
		if c := strings.Count(b, "/") - strings.Count(a, "/"); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	explicit := make(map[string]stagedDir, len(s.dirs))
	for _, d := range s.dirs {
		explicit[d.name] = d
	}
	for _, name := range all {
		d, ok := explicit[name]
		if !ok {
			d = stagedDir{name: name, mode: dirPerm}
		}
		h, err := s.root.OpenFile(name, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		err = unix.Fchmod(int(h.Fd()), d.mode)
		if err == nil && s.f.cfg.UID >= 0 {
			err = unix.Fchown(int(h.Fd()), s.f.cfg.UID, s.f.cfg.GID)
		}
		if err == nil && ok {
			err = setMtime(int(h.Fd()), d.mtime)
		}
		h.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func setMtime(fd int, t time.Time) error {
	if t.IsZero() {
		return nil
	}
	tv := unix.NsecToTimeval(t.UnixNano())
	return unix.Futimes(fd, []unix.Timeval{tv, tv})
}

// checkMerge looks for conflicts before anything is moved, so a refused merge leaves the
// target untouched: a staged directory over a non-directory (ErrNotDir), a staged
// non-directory over a directory (ErrIsDir), a hard-linked foreign file (ErrForeignLink),
// a directory on another mount (ErrMountPoint).
func (f *FS) checkMerge(ctx context.Context, src, dst int) error {
	names, err := readNames(src, 0)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		var ss, ds unix.Stat_t
		if err := unix.Fstatat(src, name, &ss, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		err := unix.Fstatat(dst, name, &ds, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return err
		}
		srcDir, dstDir := ss.Mode&unix.S_IFMT == unix.S_IFDIR, ds.Mode&unix.S_IFMT == unix.S_IFDIR
		switch {
		case srcDir && !dstDir:
			return fmt.Errorf("%w: %q exists and is not a directory", ErrNotDir, name)
		case !srcDir && dstDir:
			return fmt.Errorf("%w: %q", ErrIsDir, name)
		case !srcDir:
			if ds.Mode&unix.S_IFMT == unix.S_IFREG && ds.Nlink > 1 && int(ds.Uid) != f.leaseUID {
				return fmt.Errorf("%w: %q", ErrForeignLink, name)
			}
			continue
		}
		if err := withDirs(src, dst, name, func(s, d int) error { return f.checkMerge(ctx, s, d) }); err != nil {
			return err
		}
	}
	return nil
}

// mergeInto moves every entry of src into dst, descending where both hold a directory.
func mergeInto(src, dst int) error {
	names, err := readNames(src, 0)
	if err != nil {
		return err
	}
	for _, name := range names {
		err := unix.Renameat2(src, name, dst, name, unix.RENAME_NOREPLACE)
		if err == nil {
			continue
		}
		if !errors.Is(err, unix.EEXIST) {
			return err
		}
		var ss, ds unix.Stat_t
		if err := unix.Fstatat(src, name, &ss, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if err := unix.Fstatat(dst, name, &ds, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if ss.Mode&unix.S_IFMT == unix.S_IFDIR && ds.Mode&unix.S_IFMT == unix.S_IFDIR {
			if err := withDirs(src, dst, name, mergeInto); err != nil {
				return err
			}
			continue
		}
		if err := unix.Renameat(src, name, dst, name); err != nil {
			return err
		}
	}
	return nil
}

// withDirs opens the directory name in both src and dst, never following a symlink and
// never leaving dst's mount.
func withDirs(src, dst int, name string, fn func(s, d int) error) error {
	s, err := openDirAt(src, name, mustMnt(src))
	if err != nil {
		return err
	}
	defer unix.Close(s)
	d, err := openDirAt(dst, name, mustMnt(dst))
	if err != nil {
		return err
	}
	defer unix.Close(d)
	return fn(s, d)
}
