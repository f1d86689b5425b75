package client

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// UploadOptions tune Upload.
type UploadOptions struct {
	// Mode of the file; 0 keeps the daemon's default.
	Mode fs.FileMode
	// MkdirAll creates missing parent directories.
	MkdirAll bool
	// SHA256 of the whole content, when the caller knows it: saves a read pass.
	SHA256 []byte
	// Progress, when set, is told how many bytes the daemon holds so far (it may go back
	// when a resume starts from an earlier offset).
	Progress func(sent, total int64)
}

// uploadAttempts bounds the PATCH requests of one Upload.
const uploadAttempts = 6

// Upload streams size bytes of r as the file at p with the resumable-upload protocol: one
// PATCH from offset 0 with Upload-Complete and the whole file's Repr-Digest. When the
// connection breaks it asks the daemon (HEAD) how much arrived, seeks r there and sends
// the rest. The file appears only whole and verified.
func (l *Lease) Upload(ctx context.Context, p string, r io.ReadSeeker, size int64, opts UploadOptions) error {
	fp, err := l.lpath("files", p)
	if err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("%w: negative size", ErrInvalidRequest)
	}
	sum := opts.SHA256
	if sum == nil {
		if sum, err = hashSection(r, size); err != nil {
			return err
		}
	}
	h := http.Header{
		apitype.HeaderUploadComplete: {"?1"},
		apitype.HeaderReprDigest:     {apitype.FormatDigest(sum)},
		apitype.HeaderUploadLength:   {strconv.FormatInt(size, 10)},
		"Content-Type":               {"application/partial-upload"},
	}
	if opts.Mode != 0 {
		h.Set(apitype.HeaderFileMode, fileModeHeader(opts.Mode))
	}
	var q url.Values
	if opts.MkdirAll {
		q = url.Values{"mkdirs": {"1"}}
	}
	var offset int64
	for attempt := 1; ; attempt++ {
		err := l.patch(ctx, fp, q, h.Clone(), r, offset, size, opts.Progress)
		if err == nil {
			return nil
		}
		if !resumable(err) || attempt >= uploadAttempts || ctx.Err() != nil {
			return err
		}
		if werr := l.c.retry.wait(ctx, attempt); werr != nil {
			return err
		}
		off, herr := l.uploadOffset(ctx, fp)
		if herr != nil {
			return fmt.Errorf("client: upload of %s broke (%v) and its offset is unknown: %w", p, err, herr)
		}
		if off > size {
			off = 0
		}
		l.c.log.DebugContext(ctx, "upload cut; resuming", "path", p, "offset", off, "err", err)
		offset = off
	}
}

// resumable reports whether a failed PATCH may be followed by a HEAD and a resume.
func resumable(err error) bool {
	var apiErr *APIError
	if errors.As(err, &apiErr) {
		return apiErr.Status == http.StatusServiceUnavailable || apiErr.Code == apitype.CodeConflict
	}
	return isConnError(err) || errors.Is(err, errBodyDetached)
}

// patch sends r[offset:size] as one PATCH.
func (l *Lease) patch(ctx context.Context, fp string, q url.Values, h http.Header, r io.ReadSeeker,
	offset, size int64, progress func(int64, int64)) error {
	if _, err := r.Seek(offset, io.SeekStart); err != nil {
		return fmt.Errorf("client: upload: seek: %w", err)
	}
	h.Set(apitype.HeaderUploadOffset, strconv.FormatInt(offset, 10))
	body := &detachableReader{r: io.LimitReader(r, size-offset), sent: offset, total: size, progress: progress}
	defer body.detach()
	if progress != nil {
		progress(offset, size)
	}
	resp, err := l.c.do(ctx, request{method: http.MethodPatch, path: fp, query: q, header: h,
		stream: body, length: size - offset, lease: l, bulk: true})
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProblemBytes))
	resp.Body.Close()
	return nil
}

// uploadOffset asks how much of an interrupted upload the daemon holds; no upload in
// progress means starting over at 0.
func (l *Lease) uploadOffset(ctx context.Context, fp string) (int64, error) {
	resp, err := l.c.do(ctx, request{method: http.MethodHead, path: fp, lease: l, idempotent: true})
	if err != nil {
		var apiErr *APIError
		if errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound {
			return 0, nil
		}
		return 0, err
	}
	resp.Body.Close()
	v := resp.Header.Get(apitype.HeaderUploadOffset)
	if v == "" {
		return 0, nil
	}
	off, err := strconv.ParseInt(v, 10, 64)
	if err != nil || off < 0 {
		return 0, fmt.Errorf("client: bad %s %q", apitype.HeaderUploadOffset, v)
	}
	return off, nil
}

// hashSection returns the sha-256 of r[0:size].
func hashSection(r io.ReadSeeker, size int64) ([]byte, error) {
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("client: upload: seek: %w", err)
	}
	h := sha256.New()
	n, err := io.CopyBuffer(h, io.LimitReader(r, size), make([]byte, 256<<10))
	if err != nil {
		return nil, fmt.Errorf("client: upload: read: %w", err)
	}
	if n != size {
		return nil, fmt.Errorf("%w: the source holds %d bytes, not %d", ErrInvalidRequest, n, size)
	}
	return h.Sum(nil), nil
}

var errBodyDetached = errors.New("client: request body detached")

// detachableReader lets Upload take its reader back: net/http may still read a request
// body after RoundTrip returns, and the next attempt must not race it on the same source.
type detachableReader struct {
	mu       sync.Mutex
	r        io.Reader
	detached bool
	sent     int64
	total    int64
	progress func(int64, int64)
}

func (d *detachableReader) Read(b []byte) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.detached {
		return 0, errBodyDetached
	}
	n, err := d.r.Read(b)
	d.sent += int64(n)
	if d.progress != nil && n > 0 {
		d.progress(d.sent, d.total)
	}
	return n, err
}

func (d *detachableReader) detach() {
	d.mu.Lock()
	d.detached = true
	d.mu.Unlock()
}
