package fsxfer

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// WriteOptions tune WriteFile and the completion of a resumable upload.
type WriteOptions struct {
	Mode      fs.FileMode // permission bits; 0: 0644. setuid, setgid and sticky are dropped
	Mkdirs    bool        // create missing parent directories
	SHA256    []byte      // expected digest of the whole file, or nil
	Exclusive bool        // fail with ErrExists instead of replacing
	// IfMatch, when set, is the ETag (Info.ETag) the file being replaced must have, or
	// "*" for any existing file; checked before writing and again just before the
	// rename: ErrPrecondition on a mismatch, and nothing is written.
	IfMatch string
}

func (o WriteOptions) perm() uint32 {
	if o.Mode&fs.ModePerm == 0 {
		return 0o644
	}
	return uint32(o.Mode & fs.ModePerm)
}

// tempPrefix names the temporary files and staging directories of writes in progress.
const tempPrefix = ".sidecar-tmp-"

// WriteFile writes r as the file at path, atomically: it streams to a temporary file in
// the same directory (created O_EXCL, mode 0600 until done), hashes while writing,
// enforces the quota while streaming, fsyncs, sets mode and owner by descriptor and
// renames over the target. Any failure (digest mismatch, quota, ctx, a reader error)
// removes the temporary file: readers see the old file or the whole new one. created
// reports that no file was there before.
func (f *FS) WriteFile(ctx context.Context, p string, r io.Reader, o WriteOptions) (created bool, err error) {
	rel, err := f.clean(p)
	if err != nil {
		return false, err
	}
	if rel == "." {
		return false, wrap("write", rel, ErrIsDir)
	}
	if o.SHA256 != nil && len(o.SHA256) != sha256.Size {
		return false, wrap("write", rel, ErrInvalid)
	}
	if o.Mkdirs {
		if err := f.mkdirAll(path.Dir(rel)); err != nil {
			return false, err
		}
	}
	if err := f.quotaBase(ctx); err != nil { // a fresh enough base for the quota
		return false, wrap("write", rel, err)
	}
	d, base, err := f.openParent(rel)
	if err != nil {
		return false, err
	}
	defer d.Close()
	replaced, err := f.checkReplaceable(fd(d), base, o.Exclusive)
	if err != nil {
		return false, wrap("write", rel, err)
	}
	if err := checkIfMatch(fd(d), base, o.IfMatch); err != nil {
		return false, wrap("write", rel, err)
	}
	tmp, err := createTemp(fd(d))
	if err != nil {
		return false, wrap("write", rel, err)
	}
	res, err := f.beginWrite(tmp.f, 0)
	if err != nil {
		tmp.discard()
		return false, wrap("write", rel, err)
	}
	kept := int64(0)
	defer func() { res.end(kept) }()

	var h hash.Hash
	if o.SHA256 != nil {
		h = sha256.New()
	}
	if _, err := copyIn(ctx, tmp.f, 0, r, res, h); err != nil {
		tmp.discard()
		return false, wrap("write", rel, err)
	}
	if h != nil && !bytes.Equal(h.Sum(nil), o.SHA256) {
		tmp.discard()
		return false, wrap("write", rel, ErrDigest)
	}
	if err := f.finishFile(tmp.f, o.perm()); err != nil {
		tmp.discard()
		return false, wrap("write", rel, err)
	}
	if err := ctx.Err(); err != nil {
		tmp.discard()
		return false, wrap("write", rel, err)
	}
	if err := checkIfMatch(fd(d), base, o.IfMatch); err != nil {
		tmp.discard()
		return false, wrap("write", rel, err)
	}
	created, err = commitAt(fd(d), tmp.name, fd(d), base, o.Exclusive)
	if err != nil {
		tmp.discard()
		return false, wrap("write", rel, err)
	}
	kept = allocated(tmp.f)
	if h != nil {
		rememberDigest(tmp.f, h.Sum(nil))
	}
	if !created {
		f.meter.forget(replaced)
	}
	tmp.f.Close()
	_ = d.Sync() // make the rename durable; the data already is
	return created, nil
}

// checkReplaceable refuses to write over a directory, over anything with Exclusive, and
// over a hard-linked file that is not the lease's. It returns the disk space replacing
// the current file frees.
func (f *FS) checkReplaceable(dirfd int, name string, exclusive bool) (frees int64, err error) {
	var st unix.Stat_t
	err = unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return 0, ErrIsDir
	case exclusive:
		return 0, ErrExists
	case st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1 && int(st.Uid) != f.leaseUID:
		return 0, ErrForeignLink
	case st.Nlink > 1:
		return 0, nil // other links keep the blocks
	}
	return st.Blocks * 512, nil
}

// beginWrite registers the open file with the quota meter.
func (f *FS) beginWrite(h *os.File, existing int64) (*reservation, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(h.Fd()), &st); err != nil {
		return nil, err
	}
	return f.meter.begin(keyOf(&st), existing), nil
}

// finishFile sets mode and owner by descriptor (no symlink race) and syncs the data.
func (f *FS) finishFile(h *os.File, perm uint32) error {
	if err := unix.Fchmod(int(h.Fd()), perm); err != nil {
		return err
	}
	if f.cfg.UID >= 0 {
		if err := unix.Fchown(int(h.Fd()), f.cfg.UID, f.cfg.GID); err != nil {
			return err
		}
	}
	return h.Sync()
}

// commitAt renames the finished file into place. With RENAME_NOREPLACE first, created
// is exact even under races; without exclusive a second plain rename replaces.
func commitAt(fromDir int, from string, toDir int, to string, exclusive bool) (created bool, err error) {
	err = unix.Renameat2(fromDir, from, toDir, to, unix.RENAME_NOREPLACE)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, unix.EEXIST) || exclusive {
		return false, err
	}
	return false, unix.Renameat(fromDir, from, toDir, to)
}

// allocated is what the file occupies on disk.
func allocated(h *os.File) int64 {
	var st unix.Stat_t
	if unix.Fstat(int(h.Fd()), &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// tempFile is a file being written under a temporary name in dirfd.
type tempFile struct {
	f     *os.File
	dirfd int
	name  string
}

func createTemp(dirfd int) (*tempFile, error) {
	for range 16 {
		var rnd [12]byte
		_, _ = rand.Read(rnd[:])
		name := tempPrefix + hex.EncodeToString(rnd[:])
		nfd, err := unix.Openat(dirfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return &tempFile{f: os.NewFile(uintptr(nfd), name), dirfd: dirfd, name: name}, nil
	}
	return nil, unix.EEXIST
}

// discard removes the temporary file: a failed write leaves nothing behind.
func (t *tempFile) discard() {
	t.f.Close()
	_ = unix.Unlinkat(t.dirfd, t.name, 0)
}
