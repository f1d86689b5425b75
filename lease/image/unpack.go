package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Overlayfs' whiteout conventions, which the unpacked layers use so that they can be
// stacked as lowerdirs as they are.
const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	opaqueXattr    = "trusted.overlay.opaque"
)

// entryCost is what every tar entry is charged against the store limit on top of its
// size: the inode and directory entry it makes. It bounds a layer of a million empty
// files as its size bounds one large file.
const entryCost = 512

// maxEntries bounds the entries of one layer: the unpacker remembers each file and
// symlink it made, and this bounds that memory (a large distribution image has a few
// hundred thousand).
const maxEntries = 1_000_000

// unpacker writes one layer's tar stream into an empty directory. Every file is made
// through an os.Root on that directory, so no name, symlink or hard link reaches out of
// it; on top of that it refuses outright what a layer has no business holding (a path
// through a symlink, a device node, a hard link to what this layer did not make) rather
// than write a tree that differs from the layer.
type unpacker struct {
	root   *os.Root
	charge func(int64) error // against the store limit; an error refuses the layer
	// What this layer made, by cleaned path: the only state an entry is checked against.
	symlinks map[string]bool
	files    map[string]bool // regular files: what hard links may name
	entries  int
	// fileDir is the directory of the last regular file, opened through the root: the
	// next file in it is made with one openat, and its attributes set on its descriptor,
	// where each step through the root walks every component again. Any entry but a
	// regular file drops it, and so does replacing a directory (which may be it).
	fileDir     *os.File
	fileDirPath string
}

// unpack writes the layer read from r into dir, which must exist and be empty. On an
// error dir holds a partial tree, which the caller removes.
func unpack(r io.Reader, dir string, charge func(int64) error) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	u := &unpacker{root: root, charge: charge, symlinks: map[string]bool{}, files: map[string]bool{}}
	defer u.dropFileDir()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: reading the layer: %v", ErrRefused, err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
}

// cleanName is the path an entry names inside the layer, or an error when it names a
// place outside it.
func cleanName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("%w: a NUL byte in the name", ErrRefused)
	}
	p := path.Clean("/" + name)[1:] // leading slashes and "./" go; ".." cannot climb above "/"
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: the path leaves the layer (..)", ErrRefused)
		}
	}
	if p == "" {
		p = "."
	}
	return p, nil
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	p, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if p == "." {
		return nil // the layer's root: overlay takes the top layer's, which the sandbox makes
	}
	if u.entries++; u.entries > maxEntries {
		return fmt.Errorf("%w: over %d entries in one layer", ErrRefused, maxEntries)
	}
	if err := u.checkParents(p); err != nil {
		return err
	}
	if err := u.charge(entryCost); err != nil {
		return err
	}
	dir, base := path.Dir(p), path.Base(p)
	if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeGNUSparse {
		if !strings.HasPrefix(base, whiteoutPrefix) {
			return u.file(dir, base, hdr, r)
		}
	}
	u.dropFileDir()
	if err := u.root.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if base == opaqueMarker {
		return u.opaque(dir)
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		if strings.HasPrefix(base, whiteoutPrefix+whiteoutPrefix) {
			return nil // other AUFS metadata (.wh..wh.plnk and the like): nothing to make
		}
		return u.whiteout(dir, strings.TrimPrefix(base, whiteoutPrefix))
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := u.dir(p); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := u.replace(p); err != nil {
			return err
		}
		// The target is stored as text and never followed while unpacking: entries
		// through a symlink are refused, and os.Root would refuse them anyway.
		if err := u.root.Symlink(hdr.Linkname, p); err != nil {
			return err
		}
		u.symlinks[p] = true
		return u.root.Lchown(p, hdr.Uid, hdr.Gid)
	case tar.TypeLink:
		return u.link(p, hdr)
	case tar.TypeFifo:
		if err := u.replace(p); err != nil {
			return err
		}
		if err := u.mknod(dir, base, unix.S_IFIFO|0o600, 0); err != nil {
			return err
		}
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Errorf("%w: a device node", ErrRefused)
	default:
		return fmt.Errorf("%w: tar entry type %q", ErrRefused, hdr.Typeflag)
	}
	return u.attrs(p, hdr)
}

// checkParents refuses a path through a symlink this layer made: a layer that writes
// through its own symlink means to write somewhere else.
func (u *unpacker) checkParents(p string) error {
	for d := path.Dir(p); d != "."; d = path.Dir(d) {
		if u.symlinks[d] {
			return fmt.Errorf("%w: the path goes through the symlink %q", ErrRefused, d)
		}
	}
	return nil
}

// replace clears p for a new entry: a later entry of a layer replaces an earlier one of
// the same name.
func (u *unpacker) replace(p string) error {
	fi, err := u.root.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		u.dropFileDir()
		if err := u.root.RemoveAll(p); err != nil {
			return err
		}
		u.forgetUnder(p)
	} else if err := u.root.Remove(p); err != nil {
		return err
	}
	delete(u.symlinks, p)
	delete(u.files, p)
	return nil
}

func (u *unpacker) forgetUnder(p string) {
	for _, m := range []map[string]bool{u.symlinks, u.files} {
		for k := range m {
			if strings.HasPrefix(k, p+"/") {
				delete(m, k)
			}
		}
	}
}

func (u *unpacker) dir(p string) error {
	if fi, err := u.root.Lstat(p); err == nil && fi.IsDir() {
		return nil // made already (as a parent, or twice in the tar): attrs set below
	}
	if err := u.replace(p); err != nil {
		return err
	}
	return u.root.Mkdir(p, 0o700)
}

// file writes the regular file base in dir, charging its whole size before the first
// byte: a 10 GiB sparse file past the limit is refused without being written.
func (u *unpacker) file(dir, base string, hdr *tar.Header, r io.Reader) error {
	p := path.Join(dir, base)
	if hdr.Size < 0 {
		return fmt.Errorf("%w: a negative size", ErrRefused)
	}
	if err := u.charge(hdr.Size); err != nil {
		return err
	}
	d, err := u.openFileDir(dir)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	switch err := unix.Fstatat(d, base, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		if err := u.replace(p); err != nil { // drops the handle
			return err
		}
		if d, err = u.openFileDir(dir); err != nil {
			return err
		}
	case err == nil:
		if err := unix.Unlinkat(d, base, 0); err != nil {
			return err
		}
		delete(u.symlinks, p)
		delete(u.files, p)
	case !errors.Is(err, unix.ENOENT):
		return err
	}
	fd, err := unix.Openat(d, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &fs.PathError{Op: "create", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	n, err := io.Copy(f, io.LimitReader(r, hdr.Size))
	if err == nil && n != hdr.Size {
		err = fmt.Errorf("%w: the file is cut short (%d of %d bytes)", ErrRefused, n, hdr.Size)
	}
	if err == nil {
		err = fileAttrs(fd, hdr)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	u.files[p] = true
	return nil
}

// openFileDir is the descriptor of dir (made if missing), opened through the root, and
// kept as the regular files' directory.
func (u *unpacker) openFileDir(dir string) (int, error) {
	if u.fileDir != nil && u.fileDirPath == dir {
		return int(u.fileDir.Fd()), nil
	}
	u.dropFileDir()
	if err := u.root.MkdirAll(dir, 0o755); err != nil {
		return -1, err
	}
	f, err := u.root.Open(dir)
	if err != nil {
		return -1, err
	}
	u.fileDir, u.fileDirPath = f, dir
	return int(f.Fd()), nil
}

func (u *unpacker) dropFileDir() {
	if u.fileDir != nil {
		u.fileDir.Close()
		u.fileDir, u.fileDirPath = nil, ""
	}
}

// link makes a hard link to a regular file this layer made earlier: a hard link cannot
// name anything outside the layer, nor a file of another layer (which would tie the two
// layers' inodes together), nor a directory or a symlink.
func (u *unpacker) link(p string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return err
	}
	if !u.files[target] {
		return fmt.Errorf("%w: a hard link to %q, which is not a regular file of this layer", ErrRefused, hdr.Linkname)
	}
	if target == p {
		return nil
	}
	if err := u.replace(p); err != nil {
		return err
	}
	if err := u.root.Link(target, p); err != nil {
		return err
	}
	u.files[p] = true
	return nil
}

// whiteout hides name of the layers below: overlayfs reads a 0/0 character device so.
func (u *unpacker) whiteout(dir, name string) error {
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%w: a whiteout with no name", ErrRefused)
	}
	p := path.Join(dir, name)
	if err := u.checkParents(p); err != nil {
		return err
	}
	if err := u.replace(p); err != nil {
		return err
	}
	return u.mknod(dir, name, unix.S_IFCHR, 0)
}

// opaque marks dir as hiding everything of the layers below it.
func (u *unpacker) opaque(dir string) error {
	f, err := u.root.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fsetxattr(int(f.Fd()), opaqueXattr, []byte("y"), 0); err != nil {
		return fmt.Errorf("marking %q opaque (the image store needs a filesystem with trusted xattrs): %w", dir, err)
	}
	return nil
}

// mknod makes name in dir, relative to dir's descriptor opened through the root.
func (u *unpacker) mknod(dir, name string, mode uint32, dev int) error {
	f, err := u.root.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Mknodat(int(f.Fd()), name, mode, dev)
}

// attrs sets owner, mode and modification time. Set-uid and set-gid bits are dropped:
// nothing in an image gains privilege by being run. Extended attributes (file
// capabilities among them) are not carried over.
func (u *unpacker) attrs(p string, hdr *tar.Header) error {
	if err := u.root.Lchown(p, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := u.root.Chmod(p, entryMode(hdr)); err != nil {
		return err
	}
	if !hdr.ModTime.IsZero() {
		return u.root.Chtimes(p, hdr.ModTime, hdr.ModTime)
	}
	return nil
}

// fileAttrs is attrs on a regular file's descriptor.
func fileAttrs(fd int, hdr *tar.Header) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, uint32(entryMode(hdr)&0o777)|uint32(hdr.Mode&0o1000)); err != nil {
		return err
	}
	if hdr.ModTime.IsZero() {
		return nil
	}
	// futimens(2): utimensat on the descriptor itself (a NULL path).
	ts := [2]unix.Timespec{unix.NsecToTimespec(hdr.ModTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
	if _, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// entryMode is the permission bits an entry keeps: rwx and the sticky bit.
func entryMode(hdr *tar.Header) fs.FileMode {
	mode := fs.FileMode(hdr.Mode & 0o777)
	if hdr.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}
