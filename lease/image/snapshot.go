package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A snapshot is an image made from a lease: its base image's layers with one more on
// top, holding what the lease wrote into its root (its writable layer, whiteouts
// included) and its workspace and home at SnapshotWorkspace and SnapshotHome. The lease's
// files are written as a layer tar stream and read back through the same unpacker as a
// pulled layer, so a snapshot is content-addressed and held to the same rules (no path
// out, no device, no set-uid bit, the store limit) though a lease wrote it. A lease on a
// snapshot stacks that layer like any other (nothing copied for its root) and starts with
// a copy of the workspace and home trees (CopyTree).

// Where a snapshot layer holds the lease's workspace and home: the paths their binds
// hide in the lease's root, so the layer is also an ordinary root filesystem.
const (
	SnapshotWorkspace = "workspace"
	SnapshotHome      = "home"
)

// SnapshotSource is the lease a snapshot is taken of.
type SnapshotSource struct {
	Base  string // the image the lease runs on: a listed image or a snapshot
	Lease string // its id
	// UID and GID are the lease's: what they own is root's in the snapshot, as the
	// image's own files are, so a later lease (its own uid, or root in a user namespace
	// mapped onto it) sees them as it sees the image's.
	UID, GID int
	// Trees are the lease's directories on the host and where the layer holds them:
	// its writable layer at "", its workspace at SnapshotWorkspace, its home at
	// SnapshotHome. Read without following a symlink out of any of them.
	Trees []Tree
}

// Tree is a directory written into a snapshot layer at path At ("": the layer's root).
type Tree struct{ Dir, At string }

// Snapshot makes the image name from a lease on src.Base and returns it, ready. The
// lease may keep running: a file that changes size while it is read fails the snapshot
// (ErrChanged), which the caller may retry once the lease's writers are done.
func (s *Store) Snapshot(ctx context.Context, name string, src SnapshotSource) (Info, error) {
	if err := CheckName(name); err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	base := s.images[src.Base]
	switch {
	case s.images[name] != nil:
		s.mu.Unlock()
		return Info{}, fmt.Errorf("%w: %q is an image or a snapshot already (GET /v1/images lists them); name the snapshot otherwise, or remove that one first", ErrExists, name)
	case base == nil || base.rec == nil:
		s.mu.Unlock()
		return Info{}, fmt.Errorf("%w: image %q, the lease's, is no longer in the store", ErrNotReady, src.Base)
	}
	brec := base.rec
	for _, l := range brec.Layers { // held until the record names them
		s.layerRefs[l.DiffID]++
	}
	im := &image{ref: "snapshot:" + src.Lease, snapshot: true, state: StateSaving}
	s.images[name] = im
	s.mu.Unlock()

	rec, err := s.saveSnapshot(ctx, name, brec, src)
	s.mu.Lock()
	if err != nil {
		delete(s.images, name)
	} else {
		im.rec, im.state = rec, StateReady
	}
	s.mu.Unlock()
	if err != nil {
		s.unhold(brec)
	} else {
		s.unhold(rec) // the base's layers and the new one, named by the record now
	}
	if err != nil {
		s.GC() // the new layer, if it got that far
		return Info{}, err
	}
	s.log.Info("snapshot saved", "image", name, "lease", src.Lease, "base", src.Base, "layer", rec.Layers[len(rec.Layers)-1].DiffID)
	return s.Get(name)
}

// saveSnapshot writes the lease's layer into the store and records the image.
func (s *Store) saveSnapshot(ctx context.Context, name string, brec *record, src SnapshotSource) (*record, error) {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeSnapshot(pw, src)) }()
	u, err := s.unpackStream(ctx, pr)
	pr.CloseWithError(errors.New("the store stopped reading")) // ends the writer on an error
	if err != nil {
		return nil, fmt.Errorf("snapshot of lease %s: %w", src.Lease, err)
	}
	// Held until the record names it; the same content in the store already is used
	// instead (and this copy dropped).
	placed := false
	n, err := s.ensureLayer(ctx, u.diffID, func() (int64, error) { placed = true; return s.place(u) })
	if !placed {
		s.discard(u)
	}
	if err != nil {
		return nil, err
	}
	rec := &record{Name: name, Ref: "snapshot:" + src.Lease, Env: slices.Clone(brec.Env), WorkingDir: brec.WorkingDir, User: brec.User,
		Layers:   append(slices.Clone(brec.Layers), layerRecord{DiffID: u.diffID, Bytes: n}),
		Snapshot: &snapshotRecord{Base: baseOf(brec), Lease: src.Lease, Created: time.Now().UTC()}}
	// An image's digest is its manifest's; a snapshot has no manifest, so its digest is
	// that of its layers' diffids, in order: equal content, equal digest.
	h := sha256.New()
	for _, l := range rec.Layers {
		fmt.Fprintln(h, l.DiffID)
	}
	rec.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	if err := s.writeRecord(rec); err != nil {
		s.unhold(&record{Layers: rec.Layers[len(rec.Layers)-1:]})
		return nil, err
	}
	return rec, nil
}

// baseOf is the listed image a record descends from.
func baseOf(rec *record) string {
	if rec.Snapshot != nil {
		return rec.Snapshot.Base
	}
	return rec.Name
}

// expireLoop removes snapshots past SIDECAR_SNAPSHOT_MAX_AGE, checking once a minute
// (or once per age, when shorter), until the store closes.
func (s *Store) expireLoop() {
	defer s.wg.Done()
	t := time.NewTicker(min(time.Minute, max(s.maxAge, time.Second)))
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case now := <-t.C:
			s.ExpireSnapshots(now)
		}
	}
}

// ExpireSnapshots removes the snapshots older than SIDECAR_SNAPSHOT_MAX_AGE at now that
// no lease runs on; one in use goes once its last lease is released and now is checked
// again.
func (s *Store) ExpireSnapshots(now time.Time) {
	if s.maxAge <= 0 {
		return
	}
	s.mu.Lock()
	var old []string
	for n, im := range s.images {
		if im.snapshot && im.rec != nil && im.inUse == 0 && im.state == StateReady && now.Sub(im.rec.Snapshot.Created) > s.maxAge {
			old = append(old, n)
		}
	}
	s.mu.Unlock()
	for _, n := range old {
		if err := s.Remove(n); err != nil {
			s.log.Warn("cannot remove an expired snapshot", "image", n, "err", err)
			continue
		}
		s.log.Info("removed a snapshot past SIDECAR_SNAPSHOT_MAX_AGE", "image", n, "max_age", s.maxAge)
	}
}

// writeSnapshot writes src's trees as one layer tar stream.
func writeSnapshot(w io.Writer, src SnapshotSource) error {
	tw := tar.NewWriter(w)
	for _, t := range src.Trees {
		if err := writeTree(tw, t, src.UID, src.GID); err != nil {
			return err
		}
	}
	return tw.Close()
}

// Overlayfs' attributes that make an upper directory or file depend on the layers below
// it in ways a tar layer cannot say. The sandbox mounts leases' overlays with
// redirect_dir=off and metacopy=off, so they never appear; a writable layer that has
// them (made under other options) is refused rather than saved incomplete.
var overlayDependent = []string{"trusted.overlay.redirect", "trusted.overlay.metacopy"}

// maxSnapshotDepth bounds how deep a snapshot's directories nest (the walk recurses).
const maxSnapshotDepth = 1024

// writeTree writes t's files, each as it is when read. The lease may be running, so the
// walk never resolves a path: every entry is opened relative to its directory's
// descriptor, without following a symlink and without blocking (a FIFO swapped in for a
// file or a directory is seen for what it is). A character device 0/0 (an overlay
// whiteout) becomes a .wh. entry, an opaque directory gets the .wh..wh..opq marker, and
// hard links within the tree stay hard links.
func writeTree(tw *tar.Writer, t Tree, uid, gid int) error {
	fd, err := unix.Open(t.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: t.Dir, Err: err}
	}
	w := &treeWriter{tw: tw, uid: uid, gid: gid, links: map[uint64]string{}}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return err
	}
	if t.At != "" {
		if err := w.dirHeader(fd, t.At, &st); err != nil {
			unix.Close(fd)
			return err
		}
	}
	return w.dir(fd, t.At, 0) // closes fd
}

type treeWriter struct {
	tw       *tar.Writer
	uid, gid int
	links    map[uint64]string // inode → the first name written
}

// header is the tar header of the entry name whose stat is st: the lease's uid and gid
// become root's.
func (w *treeWriter) header(name string, st *unix.Stat_t) *tar.Header {
	hdr := &tar.Header{Name: name, ModTime: time.Unix(st.Mtim.Unix()), Mode: int64(st.Mode & 0o1777), Uid: int(st.Uid), Gid: int(st.Gid), Format: tar.FormatPAX}
	if hdr.Uid == w.uid {
		hdr.Uid = 0
	}
	if hdr.Gid == w.gid {
		hdr.Gid = 0
	}
	return hdr
}

// dirHeader writes the directory name open as fd, and its opaque marker.
func (w *treeWriter) dirHeader(fd int, name string, st *unix.Stat_t) error {
	opaque, err := dirAttrs(fd, name)
	if err != nil {
		return err
	}
	hdr := w.header(name+"/", st)
	hdr.Typeflag = tar.TypeDir
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if opaque {
		return w.tw.WriteHeader(&tar.Header{Name: path.Join(name, opaqueMarker), Typeflag: tar.TypeReg, Format: tar.FormatPAX})
	}
	return nil
}

// dir writes the entries of the directory open as fd, named name in the layer, and
// closes fd.
func (w *treeWriter) dir(fd int, name string, depth int) error {
	d := os.NewFile(uintptr(fd), name)
	defer d.Close()
	if depth > maxSnapshotDepth {
		return fmt.Errorf("%w: %s: directories nested over %d deep", ErrRefused, name, maxSnapshotDepth)
	}
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names) // the same tree, the same layer digest
	for _, n := range names {
		if err := w.entry(fd, n, path.Join(name, n), depth); err != nil {
			return err
		}
	}
	return nil
}

// entry writes base, an entry of the directory dirfd, named name in the layer.
func (w *treeWriter) entry(dirfd int, base, name string, depth int) error {
	if strings.HasPrefix(base, whiteoutPrefix) {
		return fmt.Errorf("%w: %s: a name starting with %s is a whiteout in a layer; rename it to snapshot the lease", ErrRefused, name, whiteoutPrefix)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
		return nil // removed since the directory was read
	} else if err != nil {
		return &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	hdr := w.header(name, &st)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrChanged, name, err)
		}
		if err := w.dirHeader(fd, name, &st); err != nil {
			unix.Close(fd)
			return err
		}
		return w.dir(fd, name, depth+1)
	case unix.S_IFREG:
		if st.Nlink > 1 {
			if first, ok := w.links[st.Ino]; ok {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				return w.tw.WriteHeader(hdr)
			}
			w.links[st.Ino] = name
		}
		return w.file(dirfd, base, hdr)
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dirfd, base, buf)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrChanged, name, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, string(buf[:n])
		return w.tw.WriteHeader(hdr)
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return nil // a device no lease can make
		}
		return w.tw.WriteHeader(&tar.Header{Name: path.Join(path.Dir(name), whiteoutPrefix+base), Typeflag: tar.TypeReg, ModTime: hdr.ModTime, Format: tar.FormatPAX})
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
		return w.tw.WriteHeader(hdr)
	}
	return nil // a socket: nothing an image holds
}

// dirAttrs reads the overlay attributes of the directory open as fd: whether it is
// opaque, and an error if it depends on the layers below in a way a layer cannot say.
func dirAttrs(fd int, name string) (opaque bool, err error) {
	buf := make([]byte, 8)
	for _, x := range overlayDependent {
		if _, err := unix.Fgetxattr(fd, x, buf); err == nil || errors.Is(err, unix.ERANGE) {
			return false, fmt.Errorf("%w: %s has the overlay attribute %s (a layer mounted with redirect_dir or metacopy on): a snapshot cannot carry it", ErrRefused, name, x)
		}
	}
	n, err := unix.Fgetxattr(fd, opaqueXattr, buf)
	return err == nil && string(buf[:n]) == "y", nil
}

// file writes the regular file base of dirfd, whose size must not change while it is
// read.
func (w *treeWriter) file(dirfd int, base string, hdr *tar.Header) error {
	fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrChanged, hdr.Name, err)
	}
	f := os.NewFile(uintptr(fd), hdr.Name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: %s was replaced while it was read", ErrChanged, hdr.Name)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(w.tw, io.LimitReader(f, hdr.Size))
	if err != nil {
		return err
	}
	if n != hdr.Size {
		return fmt.Errorf("%w: %s shrank while it was read; retry once the lease's writers are done", ErrChanged, hdr.Name)
	}
	return nil
}

// CopyTree copies the tree src (a snapshot layer's workspace or home, which the store's
// unpacker wrote: no device, nothing outside it) into the directory dst, every file owned
// by uid and gid. A tree src lacks is nothing to copy. Files are copied with
// copy_file_range, which shares their blocks where the filesystem can (reflinks).
func CopyTree(src, dst string, uid, gid int) error {
	from, err := os.OpenRoot(src)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer from.Close()
	to, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer to.Close()
	return fs.WalkDir(from.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return err
		}
		fi, err := from.Lstat(p)
		if err != nil {
			return err
		}
		switch mode := fi.Mode(); {
		case mode.IsDir():
			if err := to.Mkdir(p, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case mode.IsRegular():
			if err := copyFile(from, to, p); err != nil {
				return err
			}
		case mode&fs.ModeSymlink != 0:
			target, err := from.Readlink(p)
			if err != nil {
				return err
			}
			if err := to.Symlink(target, p); err != nil {
				return err
			}
			return to.Lchown(p, uid, gid)
		case mode&fs.ModeNamedPipe != 0:
			if err := mkfifo(to, p); err != nil {
				return err
			}
		default:
			return nil // a whiteout: nothing below a workspace to hide
		}
		if err := to.Lchown(p, uid, gid); err != nil {
			return err
		}
		if err := to.Chmod(p, fi.Mode()&(fs.ModePerm|fs.ModeSticky)); err != nil {
			return err
		}
		return to.Chtimes(p, fi.ModTime(), fi.ModTime())
	})
}

func copyFile(from, to *os.Root, p string) error {
	in, err := from.Open(p)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := to.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = out.ReadFrom(in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

func mkfifo(root *os.Root, p string) error {
	dir, err := root.Open(path.Dir(p))
	if err != nil {
		return err
	}
	defer dir.Close()
	return unix.Mkfifoat(int(dir.Fd()), path.Base(p), 0o600)
}
