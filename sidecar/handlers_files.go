package sidecar

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/fsxfer"
)

// leaseFS resolves the request's lease and its confined filesystem.
func (s *Server) leaseFS(r *http.Request) (*fsxfer.FS, error) {
	l, err := s.activeLease(r)
	if err != nil {
		return nil, err
	}
	return s.opts.Files.FS(l)
}

func parseMode(h string) (fs.FileMode, error) {
	if h == "" {
		return 0, nil
	}
	m, err := strconv.ParseUint(h, 8, 32)
	if err != nil || m > 0o777 {
		return 0, badRequest("%s must be octal permission bits (0000-0777)", apitype.HeaderFileMode)
	}
	return fs.FileMode(m), nil
}

func writeOptions(r *http.Request, digestHeader string) (fsxfer.WriteOptions, error) {
	mode, err := parseMode(r.Header.Get(apitype.HeaderFileMode))
	if err != nil {
		return fsxfer.WriteOptions{}, err
	}
	sum, err := apitype.ParseDigest(r.Header.Get(digestHeader))
	if err != nil {
		return fsxfer.WriteOptions{}, badRequest("%v", err)
	}
	return fsxfer.WriteOptions{Mode: mode, Mkdirs: queryBool(r.URL.Query().Get("mkdirs")), SHA256: sum}, nil
}

// countingReader counts request bytes for the transfer metric.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (s *Server) handlePutFile(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	opts, err := writeOptions(r, apitype.HeaderContentDigest)
	if err != nil {
		return err
	}
	// Conditional writes (RFC 9110 13.1): If-Match names the version being replaced;
	// If-None-Match: * creates only. Both answer 412 when the file is not so.
	opts.IfMatch = r.Header.Get("If-Match")
	createOnly := false
	if inm := strings.TrimSpace(r.Header.Get("If-None-Match")); inm == "*" {
		opts.Exclusive, createOnly = true, true
	} else if inm != "" {
		return badRequest("If-None-Match on PUT takes only *")
	}
	body := &countingReader{r: r.Body}
	created, err := f.WriteFile(r.Context(), r.PathValue("path"), body, opts)
	s.metrics.bytes.WithLabelValues("in").Add(float64(body.n))
	if createOnly && errors.Is(err, fsxfer.ErrExists) {
		return errorf(http.StatusPreconditionFailed, apitype.CodePreconditionFailed, "If-None-Match: * and the file exists")
	}
	if err != nil {
		return err
	}
	if info, err := f.Stat(r.PathValue("path")); err == nil && info.Type == "file" {
		w.Header().Set("ETag", info.ETag())
	}
	if created {
		w.WriteHeader(http.StatusCreated)
	} else {
		w.WriteHeader(http.StatusNoContent)
	}
	return nil
}

// handlePatchFile appends one part of a resumable upload (IETF resumable uploads draft:
// Upload-Offset, Upload-Complete; Repr-Digest of the whole file on the last part).
func (s *Server) handlePatchFile(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	offset, err := strconv.ParseInt(r.Header.Get(apitype.HeaderUploadOffset), 10, 64)
	if err != nil || offset < 0 {
		return badRequest("%s header required: a non-negative byte offset", apitype.HeaderUploadOffset)
	}
	complete, err := parseSFBool(r.Header.Get(apitype.HeaderUploadComplete))
	if err != nil {
		return err
	}
	opts, err := writeOptions(r, apitype.HeaderReprDigest)
	if err != nil {
		return err
	}
	body := &countingReader{r: r.Body}
	next, err := f.AppendUpload(r.Context(), r.PathValue("path"), offset, body, complete, opts)
	s.metrics.bytes.WithLabelValues("in").Add(float64(body.n))
	if err != nil {
		return err
	}
	w.Header().Set(apitype.HeaderUploadOffset, strconv.FormatInt(next, 10))
	w.Header().Set(apitype.HeaderUploadComplete, sfBool(complete))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// parseSFBool reads a structured-field boolean (?1 / ?0); absent means incomplete.
func parseSFBool(v string) (bool, error) {
	switch strings.TrimSpace(v) {
	case "?1":
		return true, nil
	case "?0", "":
		return false, nil
	}
	return false, badRequest("%s must be ?1 or ?0", apitype.HeaderUploadComplete)
}

func sfBool(b bool) string {
	if b {
		return "?1"
	}
	return "?0"
}

func setStatHeaders(h http.Header, info fsxfer.Info) {
	h.Set(apitype.HeaderFileType, info.Type)
	h.Set(apitype.HeaderFileSize, strconv.FormatInt(info.Size, 10))
	h.Set(apitype.HeaderFileMode, fmt.Sprintf("%04o", info.Mode.Perm()))
	h.Set(apitype.HeaderFileMtime, info.ModTime.UTC().Format(time.RFC3339Nano))
	if info.Target != "" {
		h.Set(apitype.HeaderLinkTarget, info.Target)
	}
}

func (s *Server) handleHeadFile(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	path := r.PathValue("path")
	off, upErr := f.UploadOffset(path)
	info, statErr := f.Stat(path)
	if upErr == nil {
		w.Header().Set(apitype.HeaderUploadOffset, strconv.FormatInt(off, 10))
		w.Header().Set(apitype.HeaderUploadComplete, "?0")
	}
	if statErr != nil {
		if upErr == nil {
			w.WriteHeader(http.StatusOK)
			return nil
		}
		return statErr
	}
	setStatHeaders(w.Header(), info)
	if info.Type == "file" {
		w.Header().Set("Content-Length", strconv.FormatInt(info.Size, 10))
		w.Header().Set("Last-Modified", info.ModTime.UTC().Format(http.TimeFormat))
		w.Header().Set("ETag", etag(info))
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func etag(info fsxfer.Info) string { return info.ETag() }

func (s *Server) handleGetFile(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	path := r.PathValue("path")
	q := r.URL.Query()
	if q.Has("line_offset") || q.Has("line_limit") {
		return s.handleReadLines(w, r, f)
	}
	info, err := f.Stat(path)
	if err != nil {
		return err
	}
	if info.Type == "dir" {
		entries, err := f.List(path)
		if err != nil {
			return err
		}
		out := apitype.DirListing{Path: path, Entries: make([]apitype.FileEntry, 0, len(entries))}
		for _, e := range entries {
			out.Entries = append(out.Entries, fileEntry(e))
		}
		return writeJSON(w, http.StatusOK, out)
	}
	file, err := f.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	info = file.Info() // the opened file's, not the path's: no check-then-use race
	if d := r.URL.Query().Get("digest"); d != "" {
		if !strings.EqualFold(d, "sha-256") {
			return badRequest("digest: only sha-256 is supported")
		}
		// The digest recorded when the daemon wrote the file, if it is unchanged;
		// otherwise one pass over the file before sending it.
		raw := file.SHA256()
		if raw == nil {
			h := sha256.New()
			if _, err := io.Copy(h, file); err != nil {
				return err
			}
			if _, err := file.Seek(0, io.SeekStart); err != nil {
				return err
			}
			raw = h.Sum(nil)
		}
		sum := apitype.FormatDigest(raw)
		w.Header().Set(apitype.HeaderReprDigest, sum)
		if r.Header.Get("Range") == "" {
			w.Header().Set(apitype.HeaderContentDigest, sum)
		}
	}
	setStatHeaders(w.Header(), info)
	w.Header().Set("ETag", etag(info))
	w.Header().Set("Content-Type", "application/octet-stream")
	cw := &countingWriter{ResponseWriter: w}
	http.ServeContent(cw, r, "", info.ModTime, file)
	s.metrics.bytes.WithLabelValues("out").Add(float64(cw.n))
	return nil
}

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

func fileEntry(i fsxfer.Info) apitype.FileEntry {
	return apitype.FileEntry{
		Name: i.Name, Type: i.Type, Size: i.Size, Mode: fmt.Sprintf("%04o", i.Mode.Perm()),
		ModTime: i.ModTime, Target: i.Target,
	}
}

func (s *Server) handleDeleteFile(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	// DELETE also abandons an incomplete upload of the path (the resumable uploads
	// draft's way to give one up, e.g. after a 507): it frees its space.
	path := r.PathValue("path")
	aborted := f.AbortUpload(path) == nil
	if err := f.Remove(path, queryBool(r.URL.Query().Get("recursive"))); err != nil {
		if !(aborted && errors.Is(err, fsxfer.ErrNotFound)) {
			return err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleFileOp(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	switch q.Get("op") {
	case "mkdir":
		if err := f.Mkdir(r.PathValue("path")); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	case "replace":
		return s.handleReplace(w, r, f)
	case "move":
		to := q.Get("to")
		if to == "" {
			return badRequest("op=move needs to={path}")
		}
		if err := f.Move(r.PathValue("path"), to); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return badRequest("op must be mkdir, move or replace")
}

func (s *Server) handlePutArchive(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding")))
	switch enc {
	case "", "identity":
		enc = ""
	case "gzip", "zstd":
	default:
		return badRequest("Content-Encoding must be gzip, zstd or none")
	}
	// Like `docker cp`, a missing target directory is created; if the archive is then
	// refused, the directory goes too (it is empty: extraction stages elsewhere).
	dir := r.PathValue("path")
	created := false
	if _, err := f.Stat(dir); errors.Is(err, fsxfer.ErrNotFound) {
		if err := f.Mkdir(dir); err != nil {
			return err
		}
		created = true
	}
	body := &countingReader{r: r.Body}
	stats, err := f.ExtractTar(r.Context(), dir, body, enc)
	s.metrics.bytes.WithLabelValues("in").Add(float64(body.n))
	if err != nil {
		if created {
			_ = f.Remove(dir, false)
		}
		return err
	}
	return writeJSON(w, http.StatusOK, stats)
}

func (s *Server) handleGetArchive(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	dir := r.PathValue("path")
	// Refuse what can be refused while a problem body can still be sent.
	info, err := f.Stat(dir)
	if err != nil {
		return err
	}
	if info.Type != "dir" {
		return &Error{Status: http.StatusBadRequest, Code: apitype.CodeNotADirectory, Detail: "not a directory"}
	}
	w.Header().Set("Content-Type", "application/x-tar")
	cw := &countingWriter{ResponseWriter: w}
	var out io.Writer = cw
	if acceptsGzip(r) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Add("Vary", "Accept-Encoding")
		zw, _ := gzip.NewWriterLevel(cw, gzip.BestSpeed)
		out = zw
	}
	w.WriteHeader(http.StatusOK)
	err = f.WriteTar(r.Context(), dir, out)
	if zw, ok := out.(*gzip.Writer); ok && err == nil {
		// Only a complete tar gets the gzip trailer; on error the route aborts the stream.
		err = zw.Close()
	}
	s.metrics.bytes.WithLabelValues("out").Add(float64(cw.n))
	return err
}

// acceptsGzip reads Accept-Encoding: gzip with a q-value above zero.
func acceptsGzip(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept-Encoding"), ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(name), "gzip") {
			continue
		}
		q := 1.0
		if v, ok := strings.CutPrefix(strings.TrimSpace(params), "q="); ok {
			q, _ = strconv.ParseFloat(v, 64)
		}
		return q > 0
	}
	return false
}
