package fsxfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"regexp/syntax"
	"runtime"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Limits of Grep.
const (
	DefaultGrepMatches   = 1000
	MaxGrepMatches       = 100_000
	DefaultGrepFileBytes = 8 << 20
	MaxGrepFileBytes     = 64 << 20
	MaxGrepContext       = 10
	MaxGrepLineBytes     = 1024     // a longer line is cut (Cut set) at a UTF-8 boundary
	MaxGrepResultBytes   = 32 << 20 // text of matches and context lines in one result
	DefaultGrepTimeout   = 30 * time.Second
	MaxGrepTimeout       = 120 * time.Second
)

// GrepOptions select and bound a Grep. Include and Exclude apply to file paths (an
// excluded directory is not entered).
type GrepOptions struct {
	TreeOptions
	Pattern      string // RE2 syntax (Go regexp), or a fixed string with Fixed
	Fixed        bool
	IgnoreCase   bool
	Context      int           // lines before and after each match, 0..MaxGrepContext
	MaxMatches   int           // matching lines returned; 0: DefaultGrepMatches
	MaxFileBytes int64         // larger files are skipped unread; 0: DefaultGrepFileBytes
	Timeout      time.Duration // 0: DefaultGrepTimeout
}

// GrepMatch is one matching line. Line and Column are 1-based; Column counts bytes to
// the first match on the line. Text is the line without its newline.
type GrepMatch struct {
	Path   string
	Line   int
	Column int
	Text   string
	Cut    bool     // Text was longer than MaxGrepLineBytes
	Before []string // context lines (each cut like Text)
	After  []string
}

// GrepResult lists matches in walk order (files by name, parents first; lines in
// order). Truncated says a limit stopped the search: Reason is "matches", "bytes" or
// "time". Files with a NUL byte are binary and skipped; larger than MaxFileBytes skipped
// unread.
type GrepResult struct {
	Matches       []GrepMatch
	Truncated     bool
	Reason        string
	Files         int // files searched
	SkippedBinary int
	SkippedLarge  int
}

func (o *GrepOptions) normalize() error {
	if o.Context < 0 || o.Context > MaxGrepContext {
		return fmt.Errorf("%w: context must be 0..%d", ErrInvalid, MaxGrepContext)
	}
	if o.MaxMatches < 0 || o.MaxMatches > MaxGrepMatches {
		return fmt.Errorf("%w: max matches must be 0..%d", ErrInvalid, MaxGrepMatches)
	}
	if o.MaxMatches == 0 {
		o.MaxMatches = DefaultGrepMatches
	}
	if o.MaxFileBytes < 0 || o.MaxFileBytes > MaxGrepFileBytes {
		return fmt.Errorf("%w: max file bytes must be 0..%d", ErrInvalid, MaxGrepFileBytes)
	}
	if o.MaxFileBytes == 0 {
		o.MaxFileBytes = DefaultGrepFileBytes
	}
	if o.Timeout < 0 || o.Timeout > MaxGrepTimeout {
		return fmt.Errorf("%w: timeout must be at most %s", ErrInvalid, MaxGrepTimeout)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultGrepTimeout
	}
	return nil
}

// matcher finds matching lines in a whole file. A fixed, case-sensitive pattern is a
// plain byte search. A regexp runs first over the whole buffer as a prefilter in which
// text anchors become line anchors (so a line that matches is never missed), and
// every candidate line is then checked with the pattern itself: results are exactly
// those of matching line by line, at the speed of one pass over the buffer.
type matcher struct {
	literal []byte
	line    *regexp.Regexp
	pre     *regexp.Regexp
}

func newMatcher(pattern string, fixed, ignoreCase bool) (*matcher, error) {
	if fixed && !ignoreCase {
		return &matcher{literal: []byte(pattern)}, nil
	}
	expr := pattern
	if fixed {
		expr = regexp.QuoteMeta(pattern)
	}
	if ignoreCase {
		expr = "(?i)" + expr
	}
	line, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("%w: pattern: %v", ErrInvalid, err)
	}
	if lit, complete := line.LiteralPrefix(); complete {
		return &matcher{literal: []byte(lit)}, nil
	}
	m := &matcher{line: line}
	if tree, err := syntax.Parse(expr, syntax.Perl); err == nil {
		lineAnchors(tree)
		m.pre, _ = regexp.Compile(tree.String()) // nil: check every line
	}
	return m, nil
}

func lineAnchors(re *syntax.Regexp) {
	switch re.Op {
	case syntax.OpBeginText:
		re.Op = syntax.OpBeginLine
	case syntax.OpEndText:
		re.Op, re.Flags = syntax.OpEndLine, re.Flags&^syntax.WasDollar
	}
	for _, sub := range re.Sub {
		lineAnchors(sub)
	}
}

// each calls fn for every matching line of buf, in order, until fn returns false.
func (m *matcher) each(buf []byte, fn func(start, end, col int) bool) {
	pos := 0
	for pos < len(buf) {
		var s int
		switch {
		case m.line == nil:
			i := bytes.Index(buf[pos:], m.literal)
			if i < 0 {
				return
			}
			s = pos + i
		case m.pre != nil:
			loc := m.pre.FindIndex(buf[pos:])
			if loc == nil {
				return
			}
			s = pos + loc[0]
		default:
			s = pos
		}
		if s == len(buf) && buf[len(buf)-1] == '\n' {
			return // no line starts here
		}
		start := bytes.LastIndexByte(buf[:s], '\n') + 1
		end := bytes.IndexByte(buf[s:], '\n')
		if end < 0 {
			end = len(buf)
		} else {
			end += s
		}
		col := s - start
		if m.line != nil {
			loc := m.line.FindIndex(buf[start:end])
			col = -1
			if loc != nil {
				col = loc[0]
			}
		}
		if col >= 0 && !fn(start, end, col+1) {
			return
		}
		pos = end + 1
	}
}

// cutLine bounds a line for the result.
func cutLine(b []byte) (string, bool) {
	if len(b) <= MaxGrepLineBytes {
		return string(b), false
	}
	n := MaxGrepLineBytes
	for n > 0 && !utf8.RuneStart(b[n]) {
		n--
	}
	return string(b[:n]), true
}

type grepJob struct {
	seq int
	rel string
	f   *os.File
}

type grepOut struct {
	seq     int
	matches []GrepMatch
	binary  bool
	bytes   int
}

var grepBufs = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// Grep searches the regular files below the directory p (or the file p itself) for
// lines matching opts.Pattern. Files are opened by the walk (never through a symlink,
// never across a mount, only the lease's) and read in parallel; results come in walk
// order whatever the order reads finish in.
func (f *FS) Grep(ctx context.Context, p string, opts GrepOptions) (GrepResult, error) {
	if err := opts.normalize(); err != nil {
		return GrepResult{}, err
	}
	m, err := newMatcher(opts.Pattern, opts.Fixed, opts.IgnoreCase)
	if err != nil {
		return GrepResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()

	res := GrepResult{Matches: []GrepMatch{}}
	jobs := make(chan grepJob, 64)
	results := make(chan grepOut, 64)
	var walkErr error
	go func() {
		defer close(jobs)
		seq := 0
		send := func(j grepJob) error {
			select {
			case jobs <- j:
				return nil
			case <-ctx.Done():
				j.f.Close()
				return ctx.Err()
			}
		}
		visit := func(e treeEntry) error {
			if typeName(e.st.Mode) != "file" || (len(opts.Include) > 0 && !globMatch(opts.Include, e.rel)) {
				return nil
			}
			if e.st.Size > opts.MaxFileBytes {
				res.SkippedLarge++ // only this goroutine writes it until jobs is closed
				return nil
			}
			h, _, err := f.openFileAt(e.dirfd, e.name)
			if err != nil {
				return nil // changed since it was listed, or not the lease's
			}
			seq++
			return send(grepJob{seq: seq - 1, rel: e.rel, f: h})
		}
		walkErr = f.grepTargets(ctx, p, opts.TreeOptions, visit)
	}()
	workers := min(max(runtime.GOMAXPROCS(0), 2), 8)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range jobs {
				out := grepOut{seq: j.seq}
				if ctx.Err() == nil {
					out = grepFile(j, m, opts)
				}
				j.f.Close()
				results <- out
			}
		})
	}
	go func() { wg.Wait(); close(results) }()

	pending := map[int]grepOut{}
	next, stopped, total := 0, false, 0
	for out := range results {
		pending[out.seq] = out
		for !stopped {
			o, ok := pending[next]
			if !ok {
				break
			}
			delete(pending, next)
			next++
			res.Files++
			if o.binary {
				res.SkippedBinary++
				continue
			}
			for _, mt := range o.matches {
				if len(res.Matches) == opts.MaxMatches {
					res.Truncated, res.Reason, stopped = true, "matches", true
					break
				}
				if total += lineBytes(mt); total > MaxGrepResultBytes {
					res.Truncated, res.Reason, stopped = true, "bytes", true
					break
				}
				res.Matches = append(res.Matches, mt)
			}
			if stopped {
				cancel()
			}
		}
	}
	if !stopped {
		if errors.Is(walkErr, context.DeadlineExceeded) || (walkErr == nil && errors.Is(ctx.Err(), context.DeadlineExceeded)) {
			res.Truncated, res.Reason, walkErr = true, "time", nil
		}
	} else if errors.Is(walkErr, context.Canceled) {
		walkErr = nil
	}
	if walkErr != nil {
		return GrepResult{}, walkErr
	}
	return res, nil
}

func lineBytes(m GrepMatch) int {
	n := len(m.Text)
	for _, s := range m.Before {
		n += len(s)
	}
	for _, s := range m.After {
		n += len(s)
	}
	return n
}

// grepTargets walks the directory p, or visits p alone when it is a regular file.
func (f *FS) grepTargets(ctx context.Context, p string, opts TreeOptions, visit func(treeEntry) error) error {
	rel, err := f.clean(p)
	if err != nil {
		return err
	}
	if rel != "." {
		d, base, err := f.openParent(rel)
		if err != nil {
			return err
		}
		defer d.Close()
		if err := f.onWorkdirMount(fd(d)); err != nil {
			return wrap("grep", rel, err)
		}
		info, err := statAt(fd(d), base, rel)
		if err != nil {
			return err
		}
		if info.Type != "dir" {
			if info.Type != "file" || info.UID != f.leaseUID {
				return wrap("grep", rel, ErrNotRegular)
			}
			var st unix.Stat_t
			if err := unix.Fstatat(fd(d), base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return wrap("grep", rel, err)
			}
			err := visit(treeEntry{rel: rel, dirfd: fd(d), name: base, st: &st})
			if errors.Is(err, errStopWalk) {
				err = nil
			}
			return err
		}
	}
	_, err = f.walkTree(ctx, p, opts, visit, nil)
	return err
}

// grepFile searches one open file.
func grepFile(j grepJob, m *matcher, opts GrepOptions) grepOut {
	out := grepOut{seq: j.seq}
	bp := grepBufs.Get().(*[]byte)
	defer grepBufs.Put(bp)
	buf, err := readAllLimit(j.f, (*bp)[:0], opts.MaxFileBytes)
	*bp = buf
	if err != nil {
		return out
	}
	if bytes.IndexByte(buf, 0) >= 0 {
		out.binary = true
		return out
	}
	line, lineAt := 1, 0
	m.each(buf, func(start, end, col int) bool {
		line += bytes.Count(buf[lineAt:start], []byte{'\n'})
		lineAt = start
		text, cut := cutLine(buf[start:end])
		mt := GrepMatch{Path: j.rel, Line: line, Column: col, Text: text, Cut: cut}
		if opts.Context > 0 {
			mt.Before, mt.After = contextLines(buf, start, end, opts.Context)
		}
		out.matches = append(out.matches, mt)
		return len(out.matches) <= opts.MaxMatches // one more than asked tells truncation
	})
	return out
}

func contextLines(buf []byte, start, end, n int) (before, after []string) {
	s := start
	for k := 0; k < n && s > 0; k++ {
		ps := bytes.LastIndexByte(buf[:s-1], '\n') + 1
		t, _ := cutLine(buf[ps : s-1])
		before = append([]string{t}, before...)
		s = ps
	}
	e := end
	for k := 0; k < n && e+1 < len(buf); k++ {
		ns := e + 1
		ne := bytes.IndexByte(buf[ns:], '\n')
		if ne < 0 {
			ne = len(buf)
		} else {
			ne += ns
		}
		t, _ := cutLine(buf[ns:ne])
		after = append(after, t)
		e = ne
	}
	return before, after
}

// readAllLimit reads r into buf, at most limit bytes (a file that grew past the cap
// since it was listed is searched up to the cap).
func readAllLimit(r io.Reader, buf []byte, limit int64) ([]byte, error) {
	for int64(len(buf)) < limit {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		room := buf[len(buf):min(int64(cap(buf)), limit)]
		n, err := r.Read(room)
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}
