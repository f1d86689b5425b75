package client

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// dirBufSize buffers tar streams both ways and is the copy buffer for file contents:
// large enough that a tree of small files moves in large writes and reads.
const dirBufSize = 256 << 10

// DirOption tunes UploadDir and DownloadDir.
type DirOption func(*dirOptions)

type dirOptions struct {
	encoding string
	progress func(n int64)
}

// WithCompression compresses the tar stream: "gzip", "zstd" (upload only) or "" (none,
// the default: on a fast link compression costs more than it saves).
func WithCompression(encoding string) DirOption {
	return func(o *dirOptions) { o.encoding = encoding }
}

// WithProgress is told the running total of file content bytes moved.
func WithProgress(f func(n int64)) DirOption {
	return func(o *dirOptions) { o.progress = f }
}

func dirOpts(opts []DirOption) dirOptions {
	var o dirOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// UploadDir sends the tree at localDir into remoteDir as a tar stream made on the fly:
// nothing is staged locally. Symlinks travel as links; sockets, devices and FIFOs are
// skipped. The daemon extracts into staging and moves it into place, so a failure leaves
// nothing behind. It is not retried.
func (l *Lease) UploadDir(ctx context.Context, localDir, remoteDir string, opts ...DirOption) error {
	o := dirOpts(opts)
	ap, err := l.lpath("archive", remoteDir)
	if err != nil {
		return err
	}
	h := http.Header{"Content-Type": {"application/x-tar"}}
	switch o.encoding {
	case "":
	case "gzip", "zstd":
		h.Set("Content-Encoding", o.encoding)
	default:
		return fmt.Errorf("%w: unknown compression %q", ErrInvalidRequest, o.encoding)
	}
	if fi, err := os.Stat(localDir); err != nil {
		return err
	} else if !fi.IsDir() {
		return fmt.Errorf("%w: %s", ErrNotADirectory, localDir)
	}
	pr, pw := io.Pipe()
	walkDone := make(chan error, 1)
	go func() {
		err := writeTree(pw, localDir, o, l.c.log.Warn)
		pw.CloseWithError(err)
		walkDone <- err
	}()
	resp, err := l.c.do(ctx, request{method: http.MethodPut, path: ap, header: h, stream: pr, length: -1, lease: l})
	pr.CloseWithError(errors.New("client: upload ended"))
	walkErr := <-walkDone
	if err != nil {
		var apiErr *APIError
		if walkErr != nil && !errors.As(err, &apiErr) {
			return fmt.Errorf("client: upload %s: %w", localDir, walkErr)
		}
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProblemBytes))
	resp.Body.Close()
	return walkErr
}

// writeTree writes the tree at dir as a (possibly compressed) tar stream.
func writeTree(w io.Writer, dir string, o dirOptions, warn func(string, ...any)) error {
	// The tar writer writes each header and each small file on its own; unbuffered,
	// every one of them would cross the pipe as a separate read of the request body
	// (an HTTP/2 DATA frame and a TLS record each).
	bw := bufio.NewWriterSize(w, dirBufSize)
	w = bw
	var enc io.WriteCloser
	switch o.encoding {
	case "gzip":
		enc, _ = gzip.NewWriterLevel(bw, gzip.BestSpeed)
	case "zstd":
		z, err := zstd.NewWriter(bw, zstd.WithEncoderLevel(zstd.SpeedFastest))
		if err != nil {
			return err
		}
		enc = z
	}
	if enc != nil {
		w = enc
	}
	tw := tar.NewWriter(w)
	buf := make([]byte, dirBufSize)
	var moved int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch t := info.Mode().Type(); {
		case t == fs.ModeSymlink:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case t&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket|fs.ModeIrregular) != 0:
			warn("skipping special file", "path", p)
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		// Ownership is the lease's business, not ours.
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := io.CopyBuffer(tw, io.LimitReader(f, hdr.Size), buf)
		if err == nil && n != hdr.Size {
			err = fmt.Errorf("%s shrank while it was sent", p)
		}
		moved += n
		if o.progress != nil {
			o.progress(moved)
		}
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if enc != nil {
		if err := enc.Close(); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// DownloadDir fetches remoteDir as a tar stream and extracts it into localDir (created
// if missing). Extraction goes through an os.Root at localDir and refuses absolute or
// escaping names, links pointing out of localDir, and special files; setuid, setgid and
// sticky bits are dropped.
func (l *Lease) DownloadDir(ctx context.Context, remoteDir, localDir string, opts ...DirOption) error {
	o := dirOpts(opts)
	ap, err := l.lpath("archive", remoteDir)
	if err != nil {
		return err
	}
	accept := "identity"
	if o.encoding == "gzip" {
		accept = "gzip"
	}
	resp, err := l.c.do(ctx, request{method: http.MethodGet, path: ap, header: http.Header{"Accept-Encoding": {accept}}, bulk: true,
		lease: l, idempotent: true})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Many small reads (a 512-byte header, then a small file) on a large buffer.
	var body io.Reader = bufio.NewReaderSize(resp.Body, dirBufSize)
	switch enc := resp.Header.Get("Content-Encoding"); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return fmt.Errorf("client: download %s: %w", remoteDir, err)
		}
		defer zr.Close()
		body = zr
	case "zstd":
		zr, err := zstd.NewReader(body)
		if err != nil {
			return fmt.Errorf("client: download %s: %w", remoteDir, err)
		}
		defer zr.Close()
		body = zr
	default:
		return fmt.Errorf("client: download %s: unknown Content-Encoding %q", remoteDir, enc)
	}
	if err := os.MkdirAll(localDir, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(localDir)
	if err != nil {
		return err
	}
	defer root.Close()
	return extractTar(root, body, o.progress, l.c.log.Warn)
}

// ErrUnsafeArchive: a tar entry would land outside the target directory or is a kind of
// file the client does not create.
var ErrUnsafeArchive = errors.New("client: unsafe archive entry")

// cleanEntryName validates a tar name: relative, no "..", no NUL.
func cleanEntryName(name string) (string, error) {
	if strings.ContainsRune(name, 0) || path.IsAbs(name) {
		return "", fmt.Errorf("%w: %q", ErrUnsafeArchive, name)
	}
	c := path.Clean(name)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("%w: %q", ErrUnsafeArchive, name)
	}
	return c, nil
}

// extractTar unpacks r under root. Directory modes and times are applied last, deepest
// first, so a read-only directory can still be filled.
func extractTar(root *os.Root, r io.Reader, progress func(int64), warn func(string, ...any)) error {
	tr := tar.NewReader(r)
	x := &extractor{root: root, known: map[string]bool{".": true}}
	defer x.closeDirs()
	type dirMeta struct {
		name string
		hdr  *tar.Header
	}
	var dirs []dirMeta
	var moved int64
	buf := make([]byte, dirBufSize)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("client: read archive: %w", err)
		}
		name, err := cleanEntryName(hdr.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue
		}
		perm := fs.FileMode(hdr.Mode).Perm()
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := x.mkdirs(name); err != nil {
				return err
			}
			dirs = append(dirs, dirMeta{name, hdr})
		case tar.TypeReg:
			n, err := x.file(name, perm, hdr.ModTime, tr, buf)
			moved += n
			if err != nil {
				return err
			}
			if progress != nil {
				progress(moved)
			}
		case tar.TypeSymlink:
			target := hdr.Linkname
			if path.IsAbs(target) || strings.ContainsRune(target, 0) {
				return fmt.Errorf("%w: symlink %q points to %q", ErrUnsafeArchive, hdr.Name, target)
			}
			if _, err := cleanEntryName(path.Join(path.Dir(name), target)); err != nil {
				return fmt.Errorf("%w: symlink %q points to %q", ErrUnsafeArchive, hdr.Name, target)
			}
			if err := x.mkdirs(path.Dir(name)); err != nil {
				return err
			}
			if err := removeExisting(root, name); err != nil {
				return err
			}
			if err := root.Symlink(target, name); err != nil {
				return err
			}
		case tar.TypeLink:
			target, err := cleanEntryName(hdr.Linkname)
			if err != nil {
				return err
			}
			if err := x.mkdirs(path.Dir(name)); err != nil {
				return err
			}
			if err := removeExisting(root, name); err != nil {
				return err
			}
			if err := root.Link(target, name); err != nil {
				return err
			}
		default:
			warn("skipping archive entry of unsupported type", "name", hdr.Name, "type", string(hdr.Typeflag))
		}
	}
	slices.Reverse(dirs)
	for _, d := range dirs {
		if err := root.Chmod(d.name, fs.FileMode(d.hdr.Mode).Perm()); err != nil {
			return err
		}
		_ = root.Chtimes(d.name, d.hdr.ModTime, d.hdr.ModTime)
	}
	return nil
}

// maxOpenDirs bounds the directories an extraction keeps open.
const maxOpenDirs = 64

// extractor saves the path walks of a tree of many small files: directories it made or
// found are not made again, and the ones files go into stay open (as roots of their own,
// still inside root), so a file costs an open in its directory rather than a walk from
// the top for each of the create, the existence check and the times.
type extractor struct {
	root  *os.Root
	known map[string]bool     // directories that exist
	open  map[string]*os.Root // open directories by name
}

func (x *extractor) mkdirs(dir string) error {
	if x.known[dir] {
		return nil
	}
	if err := x.root.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for p := dir; p != "." && !x.known[p]; p = path.Dir(p) {
		x.known[p] = true
	}
	return nil
}

// dir is the open directory dir (made if missing).
func (x *extractor) dir(dir string) (*os.Root, error) {
	if dir == "." {
		return x.root, nil
	}
	if d, ok := x.open[dir]; ok {
		return d, nil
	}
	if err := x.mkdirs(dir); err != nil {
		return nil, err
	}
	d, err := x.root.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	if len(x.open) >= maxOpenDirs {
		x.closeDirs()
	}
	if x.open == nil {
		x.open = map[string]*os.Root{}
	}
	x.open[dir] = d
	return d, nil
}

func (x *extractor) closeDirs() {
	for _, d := range x.open {
		d.Close()
	}
	x.open = nil
}

// file creates the regular file name from r, replacing what was there unless it is a
// directory, with the archive's mode (whatever the umask) and time. It returns the bytes
// written.
func (x *extractor) file(name string, perm fs.FileMode, mtime time.Time, r io.Reader, buf []byte) (int64, error) {
	d, err := x.dir(path.Dir(name))
	if err != nil {
		return 0, err
	}
	base := path.Base(name)
	const flags = os.O_WRONLY | os.O_CREATE | os.O_EXCL
	f, err := d.OpenFile(base, flags, perm)
	if errors.Is(err, fs.ErrExist) { // a file of the same name (or a link) goes first
		if err := removeExisting(d, base); err != nil {
			return 0, err
		}
		f, err = d.OpenFile(base, flags, perm)
	}
	if err != nil {
		return 0, err
	}
	// Hidden behind a plain Writer: os.File's ReadFrom would copy through a buffer of
	// its own, allocated per file.
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, r, buf)
	if err == nil {
		err = f.Chmod(perm) // umask must not narrow what the archive says
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return n, err
	}
	_ = d.Chtimes(base, mtime, mtime)
	return n, nil
}

// removeExisting clears the way for a new entry without following a symlink in its place.
func removeExisting(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%w: %s", ErrIsADirectory, name)
	}
	return root.Remove(name)
}
