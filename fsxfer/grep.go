package fsxfer

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"runtime"
	"sync"
	"sync/atomic"
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
	MaxGrepResultBytes   = 16 << 20 // text of matches and context lines in one result
	DefaultGrepTimeout   = 30 * time.Second
	MaxGrepTimeout       = 120 * time.Second
	// MaxGrepProgram bounds a pattern's compiled program, in RE2 instructions, as Go's
	// regexp/syntax counts them before compiling: a counted repetition is its copies
	// (a{1000} is 1,000), so a pattern of a few KiB cannot cost hundreds of MiB.
	MaxGrepProgram = 10_000
	// GrepInstBytes is what a search charges to the search budget per instruction of its
	// pattern: the two programs it compiles and the matching state of each worker (about
	// 400 bytes an instruction measured with 8 workers, 800 allocated while compiling).
	GrepInstBytes = 1024
	// grepMatchOverhead is charged per match beyond its text: the match as found and as
	// returned, and the headers of its strings.
	grepMatchOverhead = 256
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
// order). Truncated says a limit stopped the search: Reason is "matches", "bytes",
// "time" or "memory" (the daemon's search budget was spent). Files with a NUL byte are
// binary and skipped; larger than MaxFileBytes skipped unread.
//
// A result holds its search's share of the lease's and the daemon's search budgets
// until Release, which the caller calls once it has written the result out.
type GrepResult struct {
	Matches       []GrepMatch
	Truncated     bool
	Reason        string
	Files         int // files searched
	SkippedBinary int
	SkippedLarge  int

	hold *searchHold
}

// Release gives the search's slot and memory back to the budgets. It may be called
// more than once.
func (r GrepResult) Release() { r.hold.release() }

func (o *GrepOptions) normalize() error {
	return cmp.Or( // the first refusal
		bound(&o.Context, 0, MaxGrepContext, fmt.Sprintf("context must be 0..%d", MaxGrepContext)),
		bound(&o.MaxMatches, DefaultGrepMatches, MaxGrepMatches, fmt.Sprintf("max matches must be 0..%d", MaxGrepMatches)),
		bound(&o.MaxFileBytes, DefaultGrepFileBytes, MaxGrepFileBytes, fmt.Sprintf("max file bytes must be 0..%d", MaxGrepFileBytes)),
		bound(&o.Timeout, DefaultGrepTimeout, MaxGrepTimeout, "timeout must be at most "+MaxGrepTimeout.String()))
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

// grepExpr is the regexp a pattern is matched with, and its cost: the instructions of
// its compiled program (0 for a plain byte search). A pattern over MaxGrepProgram is
// refused before anything is compiled.
func grepExpr(pattern string, fixed, ignoreCase bool) (expr string, insts int64, err error) {
	if fixed && !ignoreCase {
		return "", 0, nil
	}
	expr = pattern
	if fixed {
		expr = regexp.QuoteMeta(pattern)
	}
	if ignoreCase {
		expr = "(?i)" + expr
	}
	tree, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return "", 0, fmt.Errorf("%w: pattern: %v", ErrInvalid, err)
	}
	if insts = progSize(tree); insts > MaxGrepProgram {
		return "", 0, fmt.Errorf("%w: the pattern compiles to about %d instructions, over the %d allowed (counted repetitions such as a{1000} count each copy): simplify it, or search a shorter form and filter the results",
			ErrPatternTooComplex, insts, MaxGrepProgram)
	}
	return expr, insts, nil
}

// progSize is the size in instructions of the program re compiles to, counted as Go's
// regexp/syntax counts it against its own (much larger) limit; saturates above
// MaxGrepProgram.
func progSize(re *syntax.Regexp) int64 {
	var size int64
	switch re.Op {
	case syntax.OpLiteral:
		size = int64(len(re.Rune))
	case syntax.OpCapture, syntax.OpStar:
		size = 2 + progSize(re.Sub[0])
	case syntax.OpPlus, syntax.OpQuest:
		size = 1 + progSize(re.Sub[0])
	case syntax.OpConcat, syntax.OpAlternate:
		for _, sub := range re.Sub {
			size += progSize(sub)
		}
		if re.Op == syntax.OpAlternate {
			size += int64(len(re.Sub)) - 1
		}
	case syntax.OpRepeat:
		sub := progSize(re.Sub[0])
		switch {
		case re.Max == -1 && re.Min == 0:
			size = 2 + sub
		case re.Max == -1:
			size = 1 + int64(re.Min)*sub
		default:
			size = int64(re.Max)*sub + int64(re.Max-re.Min)
		}
	}
	return min(max(1, size), MaxGrepProgram+1) // saturate: no overflow however deep
}

func newMatcher(pattern string, fixed, ignoreCase bool) (*matcher, error) {
	expr, _, err := grepExpr(pattern, fixed, ignoreCase)
	if err != nil {
		return nil, err
	}
	if expr == "" {
		return &matcher{literal: []byte(pattern)}, nil
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

// grepJob is a run of files of one directory, consecutive in walk order. Workers
// take jobs in order from a shared list and leave their results in them: under CPU
// contention, a hand-off per file (or per job) through channels costs more in waiting
// for the scheduler than the search itself, so the walk and the workers meet only at
// a lock when one of them runs ahead.
type grepJob struct {
	dir   *dirRef // held until the job is searched (or dropped)
	files []grepName
	outs  []grepOut
	done  bool
}

type grepName struct {
	rel, name string
	ino       uint64 // from the directory entry: 0 when unknown
}

// grepOut is what one file gave.
type grepOut struct {
	matches []GrepMatch
	binary  bool
	large   bool
	skipped bool  // not searched: gone, or not a regular file of the lease
	nomem   bool  // not (wholly) searched: the search budget was spent
	held    int64 // bytes of the search budget its matches hold
}

const (
	maxGrepBatch = 64     // files in one job
	maxGrepLead  = 16_384 // files the walk may list ahead of the workers
)

// grepPoolBytes is the size of the pooled buffer each worker reads a file into; a
// larger file is read into a buffer of its own, charged to the search budget while it
// is searched, and left to the collector.
const grepPoolBytes = 64 << 10

var grepBufs = sync.Pool{New: func() any { b := make([]byte, 0, grepPoolBytes); return &b }}

// grepRun is one Grep: the job list shared by the walk and the workers.
type grepRun struct {
	f    *FS
	m    *matcher
	opts GrepOptions
	hold *searchHold

	mu      sync.Mutex
	cond    *sync.Cond
	jobs    []*grepJob
	next    int // the next job to take
	listed  int // files in jobs
	taken   int // files in jobs[:next]
	walked  bool
	stopped atomic.Bool // enough matches (or bytes) found, the time is up, or no memory
	noMem   atomic.Bool // the search budget was spent
	matches atomic.Int64
	bytes   atomic.Int64
}

// Grep searches the regular files below the directory p (or the file p itself) for
// lines matching opts.Pattern. Files are opened in directories the walk opened (never
// through a symlink, never across a mount, only the lease's) and searched in parallel;
// results come in walk order whatever order the searches finish in.
//
// A search takes one of the lease's MaxSearchesPerLease slots and one of the daemon's
// (ErrSearchLimit beyond either), and charges its pattern (GrepInstBytes an
// instruction: ErrSearchLimit when the budget cannot hold it), the files it holds in
// memory beyond a pooled buffer and its matches to the daemon's search budget; when
// the budget is spent mid-search the result is truncated with Reason "memory". The
// caller must Release the result.
func (f *FS) Grep(ctx context.Context, p string, opts GrepOptions) (_ GrepResult, err error) {
	if err := opts.normalize(); err != nil {
		return GrepResult{}, err
	}
	_, insts, err := grepExpr(opts.Pattern, opts.Fixed, opts.IgnoreCase)
	if err != nil {
		return GrepResult{}, err
	}
	hold, err := f.admitSearch()
	if err != nil {
		return GrepResult{}, err
	}
	defer func() {
		if err != nil {
			hold.release()
		}
	}()
	if !hold.take(insts * GrepInstBytes) {
		return GrepResult{}, fmt.Errorf("%w: the daemon's searches hold its search memory budget (%d bytes, SIDECAR_SEARCH_BUDGET_BYTES); retry shortly, or with a simpler pattern",
			ErrSearchLimit, f.budgets.cfg.SearchBytes)
	}
	m, err := newMatcher(opts.Pattern, opts.Fixed, opts.IgnoreCase)
	if err != nil {
		return GrepResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	g := &grepRun{f: f, m: m, opts: opts, hold: hold}
	g.cond = sync.NewCond(&g.mu)
	stopOnDone := context.AfterFunc(ctx, g.stop)
	defer stopOnDone()

	var walkErr error
	walked := make(chan struct{})
	go func() {
		defer close(walked)
		walkErr = g.walk(ctx, p)
	}()
	var wg sync.WaitGroup
	for range min(max(runtime.GOMAXPROCS(0), 2), 8) - 1 {
		wg.Go(g.work)
	}
	g.work() // this goroutine is a worker too
	wg.Wait()
	<-walked

	// Assemble in walk order. A job left undone after a stop is searched here if the
	// jobs before it did not reach the limits.
	res := GrepResult{Matches: []GrepMatch{}, hold: hold}
	total := 0
	defer func() {
		for _, j := range g.jobs {
			if j.dir != nil {
				j.dir.release()
			}
		}
	}()
	timedOut := ctx.Err() != nil
	for _, j := range g.jobs {
		complete := true
		if !j.done {
			if timedOut {
				res.Truncated, res.Reason = true, "time"
				return res, nil
			}
			complete = g.search(j, true)
		}
		for _, o := range j.outs {
			switch {
			case o.skipped:
				continue
			case o.large:
				res.SkippedLarge++
				continue
			case o.binary:
				res.SkippedBinary++
				continue
			}
			res.Files++
			for _, mt := range o.matches {
				if len(res.Matches) == opts.MaxMatches {
					res.Truncated, res.Reason = true, "matches"
					return res, nil
				}
				if total += lineBytes(mt); total > MaxGrepResultBytes {
					res.Truncated, res.Reason = true, "bytes"
					return res, nil
				}
				res.Matches = append(res.Matches, mt)
			}
		}
		if !complete {
			res.Truncated, res.Reason = true, "memory"
			return res, nil
		}
	}
	if errors.Is(walkErr, errStopWalk) {
		if g.noMem.Load() { // the walk stopped before listing every file
			res.Truncated, res.Reason = true, "memory"
			return res, nil
		}
		walkErr = nil
	}
	if timedOut && (walkErr == nil || errors.Is(walkErr, context.DeadlineExceeded)) {
		res.Truncated, res.Reason, walkErr = true, "time", nil
	}
	if walkErr != nil {
		return GrepResult{}, walkErr
	}
	return res, nil
}

func (g *grepRun) stop() {
	g.stopped.Store(true)
	g.mu.Lock()
	g.cond.Broadcast()
	g.mu.Unlock()
}

// walk lists the files to search into jobs, waiting when it runs too far ahead.
func (g *grepRun) walk(ctx context.Context, p string) error {
	var batch *grepJob
	add := func() error {
		if batch == nil {
			return nil
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		g.jobs = append(g.jobs, batch)
		g.listed += len(batch.files)
		batch = nil
		g.cond.Broadcast()
		for g.listed-g.taken > maxGrepLead && !g.stopped.Load() {
			g.cond.Wait()
		}
		if g.stopped.Load() {
			return errStopWalk
		}
		return nil
	}
	visit := func(e *treeEntry) error {
		if e.mode == unix.S_IFDIR {
			return add() // files below it come later in walk order
		}
		if e.mode != unix.S_IFREG || (len(g.opts.Include) > 0 && !globMatch(g.opts.Include, e.rel)) {
			return nil
		}
		if batch != nil && (batch.dir != e.dir || len(batch.files) == maxGrepBatch) {
			if err := add(); err != nil {
				return err
			}
		}
		if batch == nil {
			e.dir.hold()
			batch = &grepJob{dir: e.dir}
		}
		batch.files = append(batch.files, grepName{e.rel, e.name, e.ino})
		return nil
	}
	err := g.f.grepTargets(ctx, p, g.opts.TreeOptions, visit)
	if err == nil {
		err = add()
	} else if batch != nil {
		batch.dir.release()
	}
	g.mu.Lock()
	g.walked = true
	g.cond.Broadcast()
	g.mu.Unlock()
	return err
}

// work searches jobs in order until there are none left or the search stops.
func (g *grepRun) work() {
	for {
		g.mu.Lock()
		for g.next == len(g.jobs) && !g.walked && !g.stopped.Load() {
			g.cond.Wait()
		}
		if g.next == len(g.jobs) || g.stopped.Load() {
			g.mu.Unlock()
			return
		}
		j := g.jobs[g.next]
		g.next++
		g.taken += len(j.files)
		if g.listed-g.taken <= maxGrepLead {
			g.cond.Broadcast() // the walk may be waiting
		}
		g.mu.Unlock()
		g.search(j, false)
	}
}

// search searches the files of one job and counts what each file found towards the
// limits. A worker leaves the job undone, what it found given back, once the search
// stops (so that no worker holds more than a file's results beyond the limits), or
// when the budget is spent; the assembly (assembling) searches it again if the jobs
// before it did not reach the limits, and keeps what the files before one the budget
// could not hold gave (false: the job was cut there).
func (g *grepRun) search(j *grepJob, assembling bool) bool {
	outs := make([]grepOut, len(j.files))
	for i, fn := range j.files {
		if !assembling && g.stopped.Load() {
			g.drop(outs[:i])
			return false
		}
		o := g.f.grepFile(j.dir.fd, fn, g)
		outs[i] = o
		if o.nomem {
			g.noMem.Store(true)
			g.stop()
			if assembling {
				g.drop(outs[i : i+1])
				j.outs = outs[:i]
				return false
			}
			g.drop(outs[:i+1])
			return false
		}
		size := 0
		for _, mt := range o.matches {
			size += lineBytes(mt)
		}
		if g.matches.Add(int64(len(o.matches))) > int64(g.opts.MaxMatches) || g.bytes.Add(int64(size)) > MaxGrepResultBytes {
			g.stop()
		}
	}
	j.outs = outs
	j.dir.release()
	j.dir, j.done = nil, true
	return true
}

// drop gives back the budget the results of an undone job held.
func (g *grepRun) drop(outs []grepOut) {
	for _, o := range outs {
		g.hold.give(o.held)
	}
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
func (f *FS) grepTargets(ctx context.Context, p string, opts TreeOptions, visit func(*treeEntry) error) error {
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
			dfd, err := unix.Dup(fd(d))
			if err != nil {
				return wrap("grep", rel, err)
			}
			dir := &dirRef{fd: dfd}
			dir.hold()
			defer dir.release()
			return visit(&treeEntry{rel: rel, dir: dir, name: base, mode: unix.S_IFREG})
		}
	}
	return f.walkTree(ctx, p, opts, visit, nil)
}

// grepFile searches one file: never through a symlink, only a regular file of the
// lease, and one over the size cap is not read at all. An unchanged file comes from the
// content cache for the price of one stat.
func (f *FS) grepFile(dirfd int, j grepName, g *grepRun) grepOut {
	var out grepOut
	opts := g.opts
	var st unix.Stat_t
	if (j.ino == 0 || contentCache.has(j.ino)) && unix.Fstatat(dirfd, j.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil &&
		st.Mode&unix.S_IFMT == unix.S_IFREG && int(st.Uid) == f.leaseUID && st.Size <= opts.MaxFileBytes {
		if buf := contentCache.get(&st); buf != nil {
			return g.grepBuf(out, j, buf)
		}
	}
	readAt := cacheNow()
	nfd, fst, err := f.openFileAt(dirfd, j.name)
	if err != nil {
		out.skipped = true
		return out
	}
	defer unix.Close(nfd)
	if fst.Size > opts.MaxFileBytes {
		out.large = true
		return out
	}
	var buf []byte
	if fst.Size <= grepPoolBytes {
		bp := grepBufs.Get().(*[]byte)
		defer grepBufs.Put(bp)
		buf, err = readFD(nfd, *bp, fst.Size)
		*bp = buf[:0]
	} else {
		if !g.hold.take(fst.Size) {
			out.nomem = true
			return out
		}
		defer g.hold.give(fst.Size)
		buf, err = readFD(nfd, nil, fst.Size)
	}
	if err != nil {
		out.skipped = true
		return out
	}
	contentCache.put(fst, buf, readAt)
	return g.grepBuf(out, j, buf)
}

// grepBuf finds the matching lines of one file's contents, each charged to the search
// budget as it is kept.
func (g *grepRun) grepBuf(out grepOut, j grepName, buf []byte) grepOut {
	m, opts := g.m, g.opts
	if bytes.IndexByte(buf, 0) >= 0 {
		out.binary = true
		return out
	}
	line, lineAt, size := 1, 0, 0
	m.each(buf, func(start, end, col int) bool {
		line += bytes.Count(buf[lineAt:start], []byte{'\n'})
		lineAt = start
		text, cut := cutLine(buf[start:end])
		mt := GrepMatch{Path: j.rel, Line: line, Column: col, Text: text, Cut: cut}
		if opts.Context > 0 {
			mt.Before, mt.After = contextLines(buf, start, end, opts.Context)
		}
		cost := int64(lineBytes(mt) + grepMatchOverhead)
		if !g.hold.take(cost) {
			out.nomem = true
			return false
		}
		out.held += cost
		out.matches = append(out.matches, mt)
		size += lineBytes(mt)
		// One more than asked tells truncation.
		return len(out.matches) <= opts.MaxMatches && size <= MaxGrepResultBytes
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
