package fsxfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Resumable uploads. The bytes received so far for a lease path live in UploadsDir as
// <key>.part, key being a hash of the path, next to <key>.json, a small record naming the
// path. The part file's size is the upload offset; its mtime is the last activity, which
// ReapUploads compares with the idle limit. Every part is fsynced before AppendUpload
// returns, so an offset once reported survives a crash of the daemon. A flock on the part
// file keeps two requests from appending to one upload at once.

type uploadRecord struct {
	Path    string    `json:"path"`
	Started time.Time `json:"started"`
}

func uploadKey(rel string) string {
	sum := sha256.Sum256([]byte(rel))
	return hex.EncodeToString(sum[:16])
}

// UploadOffset is the size of the partial upload for path, ErrNotFound when there is none.
func (f *FS) UploadOffset(p string) (int64, error) {
	if f.uploads == nil {
		return 0, ErrUploadsDisabled
	}
	rel, err := f.clean(p)
	if err != nil {
		return 0, err
	}
	st, err := f.uploads.Lstat(uploadKey(rel) + ".part")
	if err != nil {
		return 0, wrap("upload offset", rel, err)
	}
	return st.Size(), nil
}

// AppendUpload appends r to the partial upload for path at offset, which must equal the
// bytes received so far (ErrOffsetMismatch otherwise, also while another request is
// appending); offset 0 starts a new upload, replacing a stale one, and a non-zero offset
// without an upload is ErrNotFound. What arrived is fsynced before it returns, also when
// r fails midway (the client resumes from the offset returned); a chunk over the quota is
// cut off again. complete=true then checks o.SHA256 over the whole file (a mismatch
// discards the upload), sets mode and owner and renames it into place like WriteFile.
func (f *FS) AppendUpload(ctx context.Context, p string, offset int64, r io.Reader, complete bool, o WriteOptions) (newOffset int64, err error) {
	if f.uploads == nil {
		return 0, ErrUploadsDisabled
	}
	rel, err := f.clean(p)
	if err != nil {
		return 0, err
	}
	if rel == "." {
		return 0, wrap("upload", rel, ErrIsDir)
	}
	if offset < 0 || (o.SHA256 != nil && len(o.SHA256) != sha256.Size) {
		return 0, wrap("upload", rel, ErrInvalid)
	}
	if err := f.quotaBase(ctx); err != nil {
		return 0, wrap("upload", rel, err)
	}
	key := uploadKey(rel)
	part, err := f.openPart(rel, key, offset)
	if err != nil {
		return 0, wrap("upload", rel, err)
	}
	defer part.Close() // releases the flock
	res, err := f.beginWrite(part, allocated(part))
	if err != nil {
		return 0, wrap("upload", rel, err)
	}
	kept := int64(0)
	defer func() { res.end(kept) }()

	// An upload sent whole in one request (the client's usual case) is hashed while it
	// streams; one resumed from an offset is hashed at completion.
	var h hash.Hash
	if offset == 0 && complete && o.SHA256 != nil {
		h = sha256.New()
	}
	n, cerr := copyIn(ctx, part, offset, r, res, h)
	if errors.Is(cerr, ErrQuota) || errors.Is(cerr, unix.ENOSPC) || errors.Is(cerr, unix.EDQUOT) {
		// The part that went over the quota, or found the disk full, leaves nothing;
		// an upload with no part accepted before it goes entirely.
		if offset == 0 {
			f.discardUpload(key, part)
			return 0, wrap("upload", rel, ErrQuota)
		}
		_ = part.Truncate(offset)
		n = offset
	}
	if err := part.Sync(); err != nil && cerr == nil {
		cerr = err
	}
	now := f.cfg.Now()
	_ = unix.Futimes(int(part.Fd()), []unix.Timeval{unix.NsecToTimeval(now.UnixNano()), unix.NsecToTimeval(now.UnixNano())})
	kept = allocated(part)
	if cerr != nil || !complete {
		return n, wrap("upload", rel, cerr)
	}

	var sum []byte
	if h != nil {
		sum = h.Sum(nil)
	}
	created, err := f.completeUpload(ctx, rel, key, part, o, sum)
	if err != nil {
		return n, wrap("upload", rel, err)
	}
	_ = created
	return n, nil
}

// openPart opens (offset > 0, or < 0 for whatever size it has) or starts (offset 0) the
// partial upload, locked.
func (f *FS) openPart(rel, key string, offset int64) (*os.File, error) {
	name := key + ".part"
	if offset == 0 {
		if old, err := f.uploads.OpenFile(name, os.O_RDWR, 0); err == nil {
			if err := lockPart(old); err != nil {
				old.Close()
				return nil, err
			}
			n := allocated(old)
			if err := f.uploads.Remove(name); err != nil {
				old.Close()
				return nil, err
			}
			old.Close()
			f.meter.forget(n)
		}
		rec, _ := json.Marshal(uploadRecord{Path: rel, Started: f.cfg.Now()})
		if err := f.writeUploadsFile(key+".json", rec); err != nil {
			return nil, err
		}
		h, err := f.uploads.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			return nil, ErrOffsetMismatch // another request started it just now
		}
		if err != nil {
			return nil, err
		}
		if err := lockPart(h); err != nil {
			h.Close()
			return nil, err
		}
		return h, nil
	}
	h, err := f.uploads.OpenFile(name, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	if err := lockPart(h); err != nil {
		h.Close()
		return nil, err
	}
	st, err := h.Stat()
	if err != nil {
		h.Close()
		return nil, err
	}
	if offset >= 0 && st.Size() != offset { // a negative offset takes the part as it is
		h.Close()
		return nil, ErrOffsetMismatch
	}
	return h, nil
}

func lockPart(h *os.File) error {
	err := unix.Flock(int(h.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return ErrOffsetMismatch
	}
	return err
}

// completeUpload verifies and moves the finished upload into the workdir.
// sum is the digest of the whole part if it was computed while streaming, else nil.
func (f *FS) completeUpload(ctx context.Context, rel, key string, part *os.File, o WriteOptions, sum []byte) (bool, error) {
	if o.SHA256 != nil {
		if sum == nil {
			var err error
			if sum, err = hashFile(ctx, part); err != nil {
				return false, err
			}
		}
		if !bytes.Equal(sum, o.SHA256) {
			f.discardUpload(key, part)
			return false, ErrDigest
		}
		defer rememberDigest(part, sum) // once the part is the file, mode and owner set
	}
	if o.Mkdirs {
		if err := f.mkdirAll(path.Dir(rel)); err != nil {
			return false, err
		}
	}
	d, base, err := f.openParent(rel)
	if err != nil {
		return false, err
	}
	defer d.Close()
	replaced, err := f.checkReplaceable(fd(d), base, o.Exclusive)
	if err != nil {
		return false, err
	}
	if err := f.finishFile(part, o.perm()); err != nil {
		return false, err
	}
	ud, err := f.uploads.OpenFile(".", os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return false, err
	}
	defer ud.Close()
	created, err := commitAt(fd(ud), key+".part", fd(d), base, o.Exclusive)
	if errors.Is(err, unix.EXDEV) {
		// Uploads on another filesystem than the workdir: copy, atomically all the same.
		if _, err := part.Seek(0, io.SeekStart); err != nil {
			return false, err
		}
		o.SHA256 = nil // verified above
		if created, err = f.WriteFile(ctx, rel, part, o); err != nil {
			return false, err
		}
		f.discardUpload(key, part)
		return created, nil
	}
	if err != nil {
		return false, err
	}
	if !created {
		f.meter.forget(replaced)
	}
	_ = d.Sync()
	_ = f.uploads.Remove(key + ".json")
	return created, nil
}

func (f *FS) discardUpload(key string, part *os.File) {
	f.meter.forget(allocated(part))
	_ = f.uploads.Remove(key + ".part")
	_ = f.uploads.Remove(key + ".json")
}

func hashFile(ctx context.Context, h *os.File) ([]byte, error) {
	buf := getBuf()
	defer putBuf(buf)
	sum := sha256.New()
	for off := int64(0); ; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := h.ReadAt(*buf, off)
		sum.Write((*buf)[:n])
		off += int64(n)
		if errors.Is(err, io.EOF) {
			return sum.Sum(nil), nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// writeUploadsFile writes a small file in the uploads directory atomically.
func (f *FS) writeUploadsFile(name string, data []byte) error {
	tmp := tempPrefix + name
	if err := f.uploads.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return f.uploads.Rename(tmp, name)
}

// ReapUploads removes partial uploads idle for longer than Config.UploadIdle at now, and
// returns how many it removed. Uploads being appended to are left alone.
func (f *FS) ReapUploads(now time.Time) (int, error) {
	if f.uploads == nil {
		return 0, nil
	}
	d, err := f.uploads.Open(".")
	if err != nil {
		return 0, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return 0, err
	}
	reaped := 0
	for _, name := range names {
		key, ok := strings.CutSuffix(name, ".part")
		if !ok {
			continue
		}
		h, err := f.uploads.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			continue
		}
		st, err := h.Stat()
		if err == nil && now.Sub(st.ModTime()) > f.cfg.UploadIdle && lockPart(h) == nil {
			f.discardUpload(key, h)
			reaped++
		}
		h.Close()
	}
	// Records without a part (a crash between the two) go too.
	for _, name := range names {
		if key, ok := strings.CutSuffix(name, ".json"); ok && !strings.HasPrefix(name, tempPrefix) {
			if _, err := f.uploads.Lstat(key + ".part"); errors.Is(err, os.ErrNotExist) {
				_ = f.uploads.Remove(name)
			}
		}
	}
	return reaped, nil
}

// AbortUpload abandons the incomplete upload of path, if any, and frees its space (the
// IETF draft's DELETE on an upload). ErrNotFound when there is none.
func (f *FS) AbortUpload(p string) error {
	if f.uploads == nil {
		return ErrUploadsDisabled
	}
	rel, err := f.clean(p)
	if err != nil {
		return err
	}
	key := uploadKey(rel)
	part, err := f.openPart(rel, key, -1)
	if err != nil {
		return wrap("abort upload", rel, err)
	}
	defer part.Close()
	f.discardUpload(key, part)
	return nil
}
