package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// fileModeHeader is the X-File-Mode value: octal permission bits.
func fileModeHeader(m fs.FileMode) string { return fmt.Sprintf("%04o", m.Perm()) }

// bulkBodyBytes is the size from which WriteFile sends on the bulk HTTP/1.1 transport.
const bulkBodyBytes = 1 << 20

// WriteFile writes data as the file at p atomically, creating missing parent directories.
// The daemon checks the body against its digest. mode 0 keeps the daemon's default.
func (l *Lease) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	fp, err := l.lpath("files", p)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	h := http.Header{apitype.HeaderContentDigest: {apitype.FormatDigest(sum[:])}, "Content-Type": {"application/octet-stream"}}
	if mode != 0 {
		h.Set(apitype.HeaderFileMode, fileModeHeader(mode))
	}
	if data == nil {
		data = []byte{}
	}
	return l.c.doJSON(ctx, request{method: http.MethodPut, path: fp, query: url.Values{"mkdirs": {"1"}},
		header: h, body: data, lease: l, idempotent: true, bulk: len(data) >= bulkBodyBytes}, nil)
}

// ReadFile returns the whole file at p, verified against the daemon's digest.
func (l *Lease) ReadFile(ctx context.Context, p string) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := l.Download(ctx, p, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// isDirResponse tells a directory listing from a file that happens to be JSON.
func isDirResponse(resp *http.Response) bool {
	if t := resp.Header.Get(apitype.HeaderFileType); t != "" {
		return t == "dir"
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	return mt == "application/json"
}

// Download streams the file at p into w and verifies its sha-256 digest. A connection
// cut mid-body is resumed with a Range request (If-Range on the ETag), so w never sees
// a byte twice. It returns the number of bytes written to w.
func (l *Lease) Download(ctx context.Context, p string, w io.Writer) (int64, error) {
	fp, err := l.lpath("files", p)
	if err != nil {
		return 0, err
	}
	hash := sha256.New()
	var (
		n    int64
		want []byte
		etag string
	)
	for attempt := 1; ; attempt++ {
		h := http.Header{"Accept-Encoding": {"identity"}} // the digest is over the raw bytes
		if n > 0 {
			h.Set("Range", fmt.Sprintf("bytes=%d-", n))
			h.Set("If-Range", etag)
		}
		resp, err := l.c.do(ctx, request{method: http.MethodGet, path: fp, query: url.Values{"digest": {"sha-256"}}, bulk: true,
			header: h, lease: l, idempotent: true})
		if err != nil {
			return n, err
		}
		if n == 0 {
			if isDirResponse(resp) {
				resp.Body.Close()
				return 0, fmt.Errorf("%w: %s", ErrIsADirectory, p)
			}
			want, _ = apitype.ParseDigest(resp.Header.Get(apitype.HeaderContentDigest)) // none: nothing to check
			etag = resp.Header.Get("ETag")
		} else if resp.StatusCode != http.StatusPartialContent {
			resp.Body.Close()
			return n, fmt.Errorf("client: %s changed while it was downloaded", p)
		}
		m, rerr, werr := copyCounted(w, hash, resp.Body, resp.ContentLength)
		resp.Body.Close()
		n += m
		if werr != nil {
			return n, werr
		}
		if rerr == nil {
			break
		}
		if !isConnError(rerr) || etag == "" || attempt >= l.c.retry.attempts || ctx.Err() != nil {
			return n, rerr
		}
		l.c.log.DebugContext(ctx, "download cut; resuming", "path", p, "offset", n, "err", rerr)
		if l.c.retry.wait(ctx, attempt) != nil {
			return n, rerr
		}
	}
	if want != nil && !bytes.Equal(want, hash.Sum(nil)) {
		return n, fmt.Errorf("%w: %s", ErrDigestMismatch, p)
	}
	return n, nil
}

// downloadChunk is what a download reads before it hands the bytes on to be hashed and
// written; three are in flight.
const downloadChunk = 256 << 10

// copyCounted copies r, of size bytes (-1: unknown), to w and hash, telling read errors
// from write errors. A body longer than a chunk is read (for a download, TLS decryption)
// on this goroutine and hashed and written on another, a chunk apart, so that sha-256 is
// not on the read path: serially the two add up, on two cores they overlap. A shorter one
// (most files an agent reads) has nothing to overlap and is copied here, through a buffer
// its size. Every byte read is hashed and written before it returns.
func copyCounted(w, hash io.Writer, r io.Reader, size int64) (n int64, rerr, werr error) {
	if size >= 0 && size <= downloadChunk {
		b := make([]byte, size)
		k, rerr := fill(r, b)
		hash.Write(b[:k])
		k, werr = w.Write(b[:k])
		if rerr == io.EOF {
			rerr = nil
		}
		return int64(k), rerr, werr
	}
	free := make(chan []byte, 3)
	for range cap(free) {
		free <- make([]byte, downloadChunk)
	}
	full := make(chan []byte, cap(free))
	var failed atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for b := range full {
			if werr == nil {
				hash.Write(b)
				var k int
				k, werr = w.Write(b)
				n += int64(k)
				failed.Store(werr != nil)
			}
			free <- b[:cap(b)]
		}
	}()
	for rerr == nil && !failed.Load() {
		b := <-free
		var k int
		k, rerr = fill(r, b)
		full <- b[:k]
	}
	close(full)
	<-done
	if rerr == io.EOF {
		rerr = nil
	}
	return n, rerr, werr
}

// fill reads into b until it is full or r fails (io.EOF at the end). One read of a TLS
// body returns a record (16 KiB at most): a chunk of many is worth a goroutine hand-off.
func fill(r io.Reader, b []byte) (int, error) {
	k := 0
	for k < len(b) {
		m, err := r.Read(b[k:])
		k += m
		if err != nil {
			return k, err
		}
	}
	return k, nil
}

// Stat describes the file at p without following a final symlink.
func (l *Lease) Stat(ctx context.Context, p string) (apitype.FileEntry, error) {
	fp, err := l.lpath("files", p)
	if err != nil {
		return apitype.FileEntry{}, err
	}
	resp, err := l.c.do(ctx, request{method: http.MethodHead, path: fp, lease: l, idempotent: true})
	if err != nil {
		return apitype.FileEntry{}, l.explainHead(ctx, fp, err)
	}
	resp.Body.Close()
	h := resp.Header
	e := apitype.FileEntry{
		Name:   path.Base(path.Clean("/" + p)),
		Type:   h.Get(apitype.HeaderFileType),
		Mode:   h.Get(apitype.HeaderFileMode),
		Target: h.Get(apitype.HeaderLinkTarget),
	}
	e.Size, _ = strconv.ParseInt(h.Get(apitype.HeaderFileSize), 10, 64)
	e.ModTime, _ = time.Parse(time.RFC3339Nano, h.Get(apitype.HeaderFileMtime))
	return e, nil
}

// explainHead: a HEAD error reply has no body, so its code is only guessed from the
// status; asking the same path with a GET for one byte returns the real problem.
func (l *Lease) explainHead(ctx context.Context, fp string, err error) error {
	var apiErr *APIError
	if !errors.As(err, &apiErr) || apiErr.Status < 400 || apiErr.Status >= 500 {
		return err
	}
	resp, gerr := l.c.do(ctx, request{method: http.MethodGet, path: fp, header: http.Header{"Range": {"bytes=0-0"}},
		lease: l, idempotent: true})
	if gerr != nil {
		var real *APIError
		if errors.As(gerr, &real) && real.Status == apiErr.Status {
			return gerr
		}
		return err
	}
	resp.Body.Close()
	return err
}

// List returns the entries of the directory at p ("" or "." is the workdir).
func (l *Lease) List(ctx context.Context, p string) ([]apitype.FileEntry, error) {
	fp, err := l.lpath("files", p)
	if err != nil {
		return nil, err
	}
	resp, err := l.c.do(ctx, request{method: http.MethodGet, path: fp, lease: l, idempotent: true})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if !isDirResponse(resp) {
		return nil, fmt.Errorf("%w: %s", ErrNotADirectory, p)
	}
	var dl apitype.DirListing
	if err := json.NewDecoder(resp.Body).Decode(&dl); err != nil {
		return nil, fmt.Errorf("client: decode listing of %s: %w", p, err)
	}
	return dl.Entries, nil
}

// Remove deletes the file or empty directory at p; recursive removes a whole tree.
func (l *Lease) Remove(ctx context.Context, p string, recursive bool) error {
	fp, err := l.lpath("files", p)
	if err != nil {
		return err
	}
	var q url.Values
	if recursive {
		q = url.Values{"recursive": {"1"}}
	}
	return l.c.doJSON(ctx, request{method: http.MethodDelete, path: fp, query: q, lease: l, idempotent: true}, nil)
}

// Mkdir creates the directory p with its parents; an existing directory is no error.
func (l *Lease) Mkdir(ctx context.Context, p string) error {
	fp, err := l.lpath("files", p)
	if err != nil {
		return err
	}
	return l.c.doJSON(ctx, request{method: http.MethodPost, path: fp, query: url.Values{"op": {"mkdir"}},
		lease: l, idempotent: true}, nil)
}

// Move renames from to to within the workdir. It is not retried: a repeated move would
// find its source gone.
func (l *Lease) Move(ctx context.Context, from, to string) error {
	fp, err := l.lpath("files", from)
	if err != nil {
		return err
	}
	if _, err := escapePath(to); err != nil {
		return err
	}
	return l.c.doJSON(ctx, request{method: http.MethodPost, path: fp, query: url.Values{"op": {"move"}, "to": {path.Clean(to)}},
		lease: l}, nil)
}
