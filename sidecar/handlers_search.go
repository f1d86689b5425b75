package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/fsxfer"
)

// Handlers of the agents' file tools: find, grep, stat, replace, watch. The rules live
// in fsxfer; these decode query parameters and encode results.

// query reads a request's query parameters. The first malformed one is kept in err, so
// a handler reads all it needs and checks once.
type query struct {
	url.Values
	err error
}

// int reads a non-negative integer parameter; absent is 0.
func (q *query) int(name string) int {
	v := q.Get(name)
	if v == "" || q.err != nil {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		q.err = badRequest("%s must be a non-negative integer", name)
	}
	return n
}

func (q *query) bool(name string) bool { return queryBool(q.Get(name)) }

func (q *query) timeout() time.Duration { return time.Duration(q.int("timeout_ms")) * time.Millisecond }

func (q *query) tree() fsxfer.TreeOptions {
	return fsxfer.TreeOptions{MaxDepth: q.int("max_depth"), Hidden: q.bool("hidden"), GitIgnore: q.bool("gitignore"),
		Include: q.Values["glob"], Exclude: q.Values["exclude"]}
}

func (s *Server) handleFind(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	q := query{Values: r.URL.Query()}
	opts := fsxfer.FindOptions{TreeOptions: q.tree(), Type: q.Get("type"), After: q.Get("after"), Limit: q.int("limit"),
		Timeout: q.timeout(), Stat: q.bool("stat")}
	if q.err != nil {
		return q.err
	}
	res, err := f.Find(r.Context(), r.PathValue("path"), opts)
	if err != nil {
		return err
	}
	out := apitype.FindResult{Entries: make([]apitype.FoundEntry, 0, len(res.Entries)), Truncated: res.Truncated, Reason: res.Reason, Next: res.Next}
	for _, e := range res.Entries {
		fe := apitype.FoundEntry{Path: e.Path, Type: e.Type, Mount: e.Mount}
		if !e.ModTime.IsZero() { // stat=1
			fe.Size, fe.Mode, fe.UID, fe.ModTime, fe.Target = e.Size, fmt.Sprintf("%04o", e.Mode.Perm()), e.UID, e.ModTime, e.Target
		}
		out.Entries = append(out.Entries, fe)
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGrep(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	q := query{Values: r.URL.Query()}
	if !q.Has("pattern") {
		return badRequest("pattern is required")
	}
	opts := fsxfer.GrepOptions{TreeOptions: q.tree(), Pattern: q.Get("pattern"), Fixed: q.bool("fixed"), IgnoreCase: q.bool("ignore_case"),
		Context: q.int("context"), MaxMatches: q.int("max_matches"), MaxFileBytes: int64(q.int("max_file_bytes")), Timeout: q.timeout()}
	if q.err != nil {
		return q.err
	}
	res, err := f.Grep(r.Context(), r.PathValue("path"), opts)
	if err != nil {
		return err
	}
	defer res.Release() // the result holds its share of the search budget until written
	return writeGrep(w, res)
}

// writeGrep writes a grep result as writeJSON would, one match at a time: the reply is
// never a second copy of the result in memory, whose matches the search budget counts.
func writeGrep(w http.ResponseWriter, res fsxfer.GrepResult) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 32<<10)
	enc := json.NewEncoder(bw)
	bw.WriteString(`{"matches":[`)
	for i, m := range res.Matches {
		if i > 0 {
			bw.WriteByte(',')
		}
		if err := enc.Encode(apitype.GrepMatch(m)); err != nil { // its newline is JSON whitespace
			return err
		}
	}
	// The other members, as the struct encodes them after its matches.
	rest, err := json.Marshal(apitype.GrepResult{Truncated: res.Truncated, Reason: res.Reason,
		Files: res.Files, SkippedBinary: res.SkippedBinary, SkippedLarge: res.SkippedLarge})
	if err != nil {
		return err
	}
	bw.WriteByte(']')
	bw.Write(bytes.TrimPrefix(rest, []byte(`{"matches":null`)))
	bw.WriteByte('\n')
	return bw.Flush()
}

func (s *Server) handleStat(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	p := r.PathValue("path")
	info, err := f.Stat(p)
	if errors.Is(err, fsxfer.ErrNotFound) {
		return writeJSON(w, http.StatusOK, apitype.FileStat{Path: p})
	}
	if err != nil {
		return err
	}
	st := apitype.FileStat{Path: p, Exists: true, Type: info.Type, Size: info.Size, Mode: fmt.Sprintf("%04o", info.Mode.Perm()),
		UID: info.UID, GID: info.GID, ModTime: info.ModTime, Target: info.Target}
	if info.Type == "file" {
		st.ETag = info.ETag()
	}
	return writeJSON(w, http.StatusOK, st)
}

// handleReplace is POST …/files/{path}?op=replace.
func (s *Server) handleReplace(w http.ResponseWriter, r *http.Request, f *fsxfer.FS) error {
	var req apitype.ReplaceRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	n, info, err := f.Replace(r.Context(), r.PathValue("path"), fsxfer.ReplaceOptions{
		Old: req.Old, New: req.New, All: req.All, IfMatch: r.Header.Get("If-Match"),
	})
	if err != nil {
		return err
	}
	w.Header().Set("ETag", info.ETag())
	return writeJSON(w, http.StatusOK, apitype.ReplaceResult{Replacements: n, ETag: info.ETag()})
}

// handleReadLines is GET …/files/{path}?line_offset=N&line_limit=M.
func (s *Server) handleReadLines(w http.ResponseWriter, r *http.Request, f *fsxfer.FS) error {
	q := query{Values: r.URL.Query()}
	offset, limit := q.int("line_offset"), q.int("line_limit")
	if q.err != nil {
		return q.err
	}
	lines, err := f.ReadLines(r.PathValue("path"), offset, limit)
	if err != nil {
		return err
	}
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("ETag", lines.Info.ETag())
	h.Set(apitype.HeaderLineOffset, strconv.Itoa(offset))
	h.Set(apitype.HeaderLineCount, strconv.Itoa(lines.Count))
	h.Set(apitype.HeaderLinesMore, sfBool(lines.More))
	h.Set("Content-Length", strconv.Itoa(len(lines.Data)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(lines.Data)
	s.metrics.bytes.WithLabelValues("out").Add(float64(len(lines.Data)))
	return nil
}

// watchHeartbeat keeps idle event streams (and proxies in between) alive.
const watchHeartbeat = 20 * time.Second

// handleWatch streams the changes below a directory as server-sent events until the
// client goes away, the lease ends (its FS closes the watch) or the daemon stops.
func (s *Server) handleWatch(w http.ResponseWriter, r *http.Request, _ principal) error {
	f, err := s.leaseFS(r)
	if err != nil {
		return err
	}
	q := query{Values: r.URL.Query()}
	opts := fsxfer.WatchOptions{Recursive: q.bool("recursive"), MaxDirs: q.int("max_dirs"), Queue: q.int("queue")}
	if q.err != nil {
		return q.err
	}
	watcher, err := f.Watch(r.PathValue("path"), opts)
	if err != nil {
		return err
	}
	defer watcher.Close()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.stopping, cancel)
	defer stop()

	events := make(chan fsxfer.WatchEvent)
	nextErr := make(chan error, 1)
	go func() {
		for {
			e, err := watcher.Next(ctx)
			if err != nil {
				nextErr <- err
				return
			}
			select {
			case events <- e:
			case <-ctx.Done():
				nextErr <- ctx.Err()
				return
			}
		}
	}()
	send := func(e apitype.WatchEvent) error {
		b, _ := json.Marshal(e)
		_ = rc.SetWriteDeadline(time.Now().Add(s.opts.Limits.WSWriteTimeout))
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.Type, b); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := send(apitype.WatchEvent{Type: apitype.WatchReady}); err != nil {
		return nil
	}
	beat := time.NewTicker(watchHeartbeat)
	defer beat.Stop()
	for {
		select {
		case e := <-events:
			if err := send(apitype.WatchEvent{Type: e.Type, Path: e.Path, OldPath: e.OldPath, Dir: e.Dir, Dropped: e.Dropped, Reason: e.Reason}); err != nil {
				return nil // the client went away or stopped reading
			}
		case <-beat.C:
			_ = rc.SetWriteDeadline(time.Now().Add(s.opts.Limits.WSWriteTimeout))
			if _, err := fmt.Fprint(w, ": ping\n\n"); err != nil || rc.Flush() != nil {
				return nil
			}
		case err := <-nextErr:
			reason := "watched directory removed or lease released"
			switch {
			case s.stopping.Err() != nil:
				reason = "daemon stopping"
			case r.Context().Err() != nil:
				return nil
			case !errors.Is(err, io.EOF) && !errors.Is(err, context.Canceled):
				reason = "watch failed"
			}
			_ = send(apitype.WatchEvent{Type: apitype.WatchEnd, Reason: reason})
			return nil
		}
	}
}
