package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// The agents' file tools: find, grep, stat, exists, lines, exact replacement,
// conditional writes and watches.

// lpath is the route of a workdir path under a lease route: "files", "archive", or a tool
// ("find", "grep", …).
func (l *Lease) lpath(tool, p string) (string, error) {
	ep, err := escapePath(p)
	if err != nil {
		return "", err
	}
	return leasePath(l.id, tool, ep), nil
}

// TreeOptions select what Find and Grep visit.
type TreeOptions struct {
	Globs     []string // doublestar globs; without "/" a glob matches the name at any depth
	Exclude   []string // globs; an excluded directory is not entered
	MaxDepth  int      // 0: no limit; 1: the directory's entries only
	Hidden    bool     // include names starting with "."
	GitIgnore bool     // honour .gitignore files
	Timeout   time.Duration
}

// options is a query of options, where a zero value is left out: the daemon's default.
type options url.Values

func (q options) int(name string, n int64) {
	if n > 0 {
		url.Values(q).Set(name, strconv.FormatInt(n, 10))
	}
}

func (q options) bool(name string, b bool) {
	if b {
		url.Values(q).Set(name, "1")
	}
}

func (q options) string(name, s string) {
	if s != "" {
		url.Values(q).Set(name, s)
	}
}

func (o TreeOptions) query() options {
	q := options{}
	for _, g := range o.Globs {
		url.Values(q).Add("glob", g)
	}
	for _, g := range o.Exclude {
		url.Values(q).Add("exclude", g)
	}
	q.int("max_depth", int64(o.MaxDepth))
	q.bool("hidden", o.Hidden)
	q.bool("gitignore", o.GitIgnore)
	q.int("timeout_ms", o.Timeout.Milliseconds())
	return q
}

// FindOptions select and bound a Find.
type FindOptions struct {
	TreeOptions
	Type  string // "", "file", "dir", "symlink" or "other"
	After string // resume after this path: a truncated result's Next
	Limit int    // 0: the daemon's default (1000)
	Stat  bool   // fill size, mode, owner, mtime and link target (one stat per entry)
}

// Find lists the entries below dir in walk order (by name, parents first). A truncated
// result carries Next, to pass as After.
func (l *Lease) Find(ctx context.Context, dir string, o FindOptions) (apitype.FindResult, error) {
	p, err := l.lpath("find", dir)
	if err != nil {
		return apitype.FindResult{}, err
	}
	q := o.query()
	q.string("type", o.Type)
	q.string("after", o.After)
	q.int("limit", int64(o.Limit))
	q.bool("stat", o.Stat)
	var res apitype.FindResult
	err = l.c.doJSON(ctx, request{method: http.MethodGet, path: p, query: url.Values(q), lease: l, idempotent: true}, &res)
	return res, err
}

// GrepOptions select and bound a Grep.
type GrepOptions struct {
	TreeOptions
	Fixed        bool // Pattern is a fixed string, not an RE2 regular expression
	IgnoreCase   bool
	Context      int   // lines before and after each match, at most 10
	MaxMatches   int   // 0: the daemon's default (1000)
	MaxFileBytes int64 // larger files are skipped; 0: the daemon's default (8 MiB)
}

// Grep searches the files below path (or the file path) for lines matching pattern.
func (l *Lease) Grep(ctx context.Context, path, pattern string, o GrepOptions) (apitype.GrepResult, error) {
	p, err := l.lpath("grep", path)
	if err != nil {
		return apitype.GrepResult{}, err
	}
	q := o.query()
	q["pattern"] = []string{pattern} // even empty: the daemon requires it
	q.bool("fixed", o.Fixed)
	q.bool("ignore_case", o.IgnoreCase)
	q.int("context", int64(o.Context))
	q.int("max_matches", int64(o.MaxMatches))
	q.int("max_file_bytes", o.MaxFileBytes)
	var res apitype.GrepResult
	err = l.c.doJSON(ctx, request{method: http.MethodGet, path: p, query: url.Values(q), lease: l, idempotent: true}, &res)
	return res, err
}

// FileStat describes p without following a final symlink; a missing path is no error
// but Exists false.
func (l *Lease) FileStat(ctx context.Context, p string) (apitype.FileStat, error) {
	sp, err := l.lpath("stat", p)
	if err != nil {
		return apitype.FileStat{}, err
	}
	var st apitype.FileStat
	err = l.c.doJSON(ctx, request{method: http.MethodGet, path: sp, lease: l, idempotent: true}, &st)
	return st, err
}

// Exists reports whether p exists (a dangling symlink exists).
func (l *Lease) Exists(ctx context.Context, p string) (bool, error) {
	st, err := l.FileStat(ctx, p)
	return st.Exists, err
}

// Lines is a slice of a text file by lines.
type Lines struct {
	Data  []byte // the lines with their newlines
	Count int
	More  bool   // the file goes on after these lines
	ETag  string // of the file read
}

// ReadLines returns up to limit lines of the file at p after the first offset lines
// (limit 0: as many as the daemon allows, 100,000 lines or 16 MiB).
func (l *Lease) ReadLines(ctx context.Context, p string, offset, limit int) (Lines, error) {
	fp, err := l.lpath("files", p)
	if err != nil {
		return Lines{}, err
	}
	q := url.Values{"line_offset": {strconv.Itoa(offset)}, "line_limit": {strconv.Itoa(limit)}}
	resp, err := l.c.do(ctx, request{method: http.MethodGet, path: fp, query: q, lease: l, idempotent: true})
	if err != nil {
		return Lines{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return Lines{}, err
	}
	n, _ := strconv.Atoi(resp.Header.Get(apitype.HeaderLineCount))
	return Lines{Data: data, Count: n, More: resp.Header.Get(apitype.HeaderLinesMore) == "?1", ETag: resp.Header.Get("ETag")}, nil
}

// ReplaceOptions tune Replace.
type ReplaceOptions struct {
	All     bool   // replace every occurrence (otherwise old must occur exactly once)
	IfMatch string // an ETag the file must still have (FileStat, ReadLines, a previous write)
}

// Replace replaces the exact text old by new in the file at p, atomically. Old absent
// is ErrOldTextNotFound; found more than once without All, ErrOldTextNotUnique; a stale
// IfMatch, ErrPreconditionFailed. In all three cases the file is unchanged. Not retried:
// a repeated replacement would find its old text gone.
func (l *Lease) Replace(ctx context.Context, p, old, new string, o ReplaceOptions) (apitype.ReplaceResult, error) {
	fp, err := l.lpath("files", p)
	if err != nil {
		return apitype.ReplaceResult{}, err
	}
	h := http.Header{}
	if o.IfMatch != "" {
		h.Set("If-Match", o.IfMatch)
	}
	var res apitype.ReplaceResult
	err = l.c.doJSON(ctx, request{method: http.MethodPost, path: fp, query: url.Values{"op": {"replace"}}, header: h,
		json: apitype.ReplaceRequest{Old: old, New: new, All: o.All}, lease: l}, &res)
	return res, err
}

// WriteCondition makes a write conditional.
type WriteCondition struct {
	IfMatch    string // replace only the version with this ETag ("*": any existing file)
	CreateOnly bool   // If-None-Match: *, write only when nothing is there
}

// WriteFileIf is WriteFile under a condition: ErrPreconditionFailed when it does not
// hold, and nothing is written. It returns the new file's ETag.
func (l *Lease) WriteFileIf(ctx context.Context, p string, data []byte, mode fs.FileMode, cond WriteCondition) (string, error) {
	fp, err := l.lpath("files", p)
	if err != nil {
		return "", err
	}
	h := http.Header{"Content-Type": {"application/octet-stream"}}
	if mode != 0 {
		h.Set(apitype.HeaderFileMode, fileModeHeader(mode))
	}
	if cond.IfMatch != "" {
		h.Set("If-Match", cond.IfMatch)
	}
	if cond.CreateOnly {
		h.Set("If-None-Match", "*")
	}
	if data == nil {
		data = []byte{}
	}
	resp, err := l.c.do(ctx, request{method: http.MethodPut, path: fp, query: url.Values{"mkdirs": {"1"}}, header: h, body: data, lease: l})
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	return resp.Header.Get("ETag"), nil
}

// WatchOptions tune a Watch.
type WatchOptions struct {
	Recursive bool
	MaxDirs   int // 0: the daemon's default (1024)
	Queue     int // events the daemon holds for a slow reader; 0: its default (4096)
}

// Watcher reads the events of a watch (server-sent events).
type Watcher struct {
	body  io.ReadCloser
	r     *bufio.Reader
	ended bool
}

// maxEventBytes bounds one event read from the stream.
const maxEventBytes = 64 << 10

// Watch watches dir for changes. It returns once the daemon watches the directories,
// so every change made after it returns is reported. Next returns the events; the watch
// ends with an "end" event (lease released, directory removed, daemon stopping), after
// which Next returns io.EOF. Close it when done.
func (l *Lease) Watch(ctx context.Context, dir string, o WatchOptions) (*Watcher, error) {
	p, err := l.lpath("watch", dir)
	if err != nil {
		return nil, err
	}
	q := options{}
	q.bool("recursive", o.Recursive)
	q.int("max_dirs", int64(o.MaxDirs))
	q.int("queue", int64(o.Queue))
	resp, err := l.c.do(ctx, request{method: http.MethodGet, path: p, query: url.Values(q), header: http.Header{"Accept": {"text/event-stream"}},
		lease: l})
	if err != nil {
		return nil, err
	}
	w := &Watcher{body: resp.Body, r: bufio.NewReaderSize(resp.Body, 64<<10)}
	e, err := w.Next()
	if err != nil || e.Type != apitype.WatchReady {
		w.Close()
		if err == nil {
			err = fmt.Errorf("client: watch %s: first event %q, want ready", dir, e.Type)
		}
		return nil, err
	}
	return w, nil
}

// Next returns the next event, blocking until one comes (cancel by closing the watcher
// or the context given to Watch). After the "end" event it returns io.EOF.
func (w *Watcher) Next() (apitype.WatchEvent, error) {
	if w.ended {
		return apitype.WatchEvent{}, io.EOF
	}
	var data []byte
	for {
		line, err := w.r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) || len(data)+len(line) > maxEventBytes {
			return apitype.WatchEvent{}, fmt.Errorf("client: watch event over %d bytes", maxEventBytes)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // the daemon always ends with an end event
			}
			return apitype.WatchEvent{}, err
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if data == nil {
				continue // a comment-only block (heartbeat)
			}
			var e apitype.WatchEvent
			if err := json.Unmarshal(data, &e); err != nil {
				return apitype.WatchEvent{}, fmt.Errorf("client: watch event: %w", err)
			}
			w.ended = e.Type == apitype.WatchEnd
			return e, nil
		case bytes.HasPrefix(line, []byte("data:")):
			data = append(data, bytes.TrimSpace(line[5:])...)
		}
	}
}

// Close ends the watch.
func (w *Watcher) Close() error { return w.body.Close() }
