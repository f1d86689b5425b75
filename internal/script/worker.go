package script

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fastschema/qjs"
)

// maxJobFrame bounds what a worker reads; the daemon enforces the real, smaller limits.
const maxJobFrame = 1 << 30

// prelude removes the host modules qjs exposes as globals: a transform reshapes JSON and
// has no use for files, timers or the process.
const prelude = `delete globalThis.std; delete globalThis.os;
delete globalThis.setTimeout; delete globalThis.setInterval;
delete globalThis.clearTimeout; delete globalThis.clearInterval;`

// WorkerMain is the hidden `__script-worker` subcommand: it serves jobs on stdin/stdout
// until stdin closes. It never returns.
func WorkerMain() {
	cfg, err := startWorker()
	if err != nil {
		fmt.Fprintln(os.Stderr, "script worker:", err)
		os.Exit(3)
	}
	// The protocol gets a private copy of stdout; fd 1 then points at stderr so that
	// nothing else (a stray print, a runtime message) can corrupt the frames.
	out, err := protocolStdout()
	if err != nil {
		fmt.Fprintln(os.Stderr, "script worker:", err)
		os.Exit(3)
	}
	if err := serve(cfg, bufio.NewReader(os.Stdin), out); err != nil {
		fmt.Fprintln(os.Stderr, "script worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// spareRuntimes is how many fresh runtimes a worker keeps made ahead of its jobs. A
// runtime costs ~2.8 ms of CPU to make (wazero instantiating the QuickJS module) and
// ~64 KiB of resident memory while it waits, so a burst of this many jobs per worker
// never waits for one.
const spareRuntimes = 4

// idleBeforeFill is the quiet a worker waits for before it makes a spare runtime.
const idleBeforeFill = 5 * time.Millisecond

// fresh is a runtime no script has touched yet, with its own log sink.
type fresh struct {
	rt   *qjs.Runtime
	sink *logSink
	err  error // the runtime could not be made: the worker is unusable
}

type worker struct {
	cfg      setup
	cacheDir string // read-only once the first runtime is made
	// spares holds fresh runtimes of cfg.MemoryBytes, made by fill in the background
	// while the worker is idle. Each serves exactly one job and is then closed: no
	// state crosses jobs, and no job waits for a runtime unless a burst drained them.
	spares chan fresh
	// busy is set while a job runs: fill makes no runtime then, so the two never compete
	// for CPU. idle (capacity 1) wakes fill when a job is done.
	busy atomic.Bool
	jobs atomic.Int64 // jobs started, to tell a quiet spell from a burst
	idle chan struct{}
}

func serve(cfg setup, in *bufio.Reader, out *os.File) error {
	if cfg.GoMemoryLimit > 0 {
		debug.SetMemoryLimit(cfg.GoMemoryLimit)
	}
	w := &worker{cfg: cfg, cacheDir: cfg.CacheDir, spares: make(chan fresh, spareRuntimes), idle: make(chan struct{}, 1)}
	// The first runtime compiles (or loads from the cache) the QuickJS module: the cold cost.
	first := w.newRuntime(cfg.MemoryBytes)
	if first.err != nil && w.cacheDir != "" {
		// An unreadable cache must not take the capability down: compile instead.
		fmt.Fprintf(os.Stderr, "script worker: compilation cache %s unusable, compiling: %v\n", w.cacheDir, first.err)
		w.cacheDir = ""
		first = w.newRuntime(cfg.MemoryBytes)
	}
	if first.err != nil {
		return first.err
	}
	w.spares <- first
	w.idle <- struct{}{}
	go w.fill()
	if err := writeFrame(out, reply{Ready: true, Landlock: cfg.Landlock}); err != nil {
		return err
	}
	for {
		var j job
		if err := readFrame(in, maxJobFrame, &j); err != nil {
			return nil // the daemon closed our stdin: done
		}
		w.busy.Store(true)
		w.jobs.Add(1)
		rep, spent := w.run(j)
		if err := writeFrame(out, rep); err != nil {
			return err
		}
		closeRuntime(spent) // after the reply: off the caller's path
		if rep.Unusable {
			return fmt.Errorf("runtime unusable after: %s", rep.Error.Message)
		}
		w.busy.Store(false)
		select {
		case w.idle <- struct{}{}:
		default: // fill is awake already
		}
	}
}

// fill tops spares up whenever the worker is between jobs, until a runtime cannot be
// made; that failure is handed to the next job, which reports the worker unusable. The
// worker's exit ends fill. Only fill adds to spares, so its sends never block.
func (w *worker) fill() {
	for range w.idle {
		for len(w.spares) < cap(w.spares) {
			// Only in a quiet spell: inside a burst the next job would share the CPU with
			// a runtime being made (~3 ms of it), which costs more than it saves.
			seen := w.jobs.Load()
			time.Sleep(idleBeforeFill)
			if w.busy.Load() || w.jobs.Load() != seen {
				break // a job came: look again when it is done
			}
			f := w.newRuntime(w.cfg.MemoryBytes)
			w.spares <- f
			if f.err != nil {
				return
			}
			if len(w.spares) == cap(w.spares) {
				// What making them left behind goes back to the kernel while the worker
				// idles (1.7 MB of its 32 MB resident).
				debug.FreeOSMemory()
			}
		}
	}
}

// take returns a fresh runtime with the given memory limit: a spare when the job asks
// for the default limit and one is ready, else one made now (QuickJS fixes the limit at
// creation; fill makes none while a job runs).
func (w *worker) take(limit int64) fresh {
	if limit == w.cfg.MemoryBytes {
		select {
		case f := <-w.spares:
			return f
		default: // a burst drained them
		}
	}
	return w.newRuntime(limit)
}

// newRuntime makes a runtime with the given memory limit and runs the prelude in it.
func (w *worker) newRuntime(limit int64) (f fresh) {
	defer func() {
		if r := recover(); r != nil {
			f = fresh{err: fmt.Errorf("new runtime: %v", r)}
		}
	}()
	sink := &logSink{maxBytes: w.cfg.MaxLogBytes, maxLines: w.cfg.MaxLogLines}
	rt, err := qjs.New(qjs.Option{
		CWD:         w.cfg.Root,
		CacheDir:    w.cacheDir,
		MemoryLimit: int(limit),
		Stdout:      sink,
		Stderr:      sink,
	})
	if err != nil {
		return fresh{err: fmt.Errorf("new runtime: %w", err)}
	}
	v, err := rt.Eval("prelude.js", qjs.Code(prelude))
	if err != nil {
		closeRuntime(rt)
		return fresh{err: fmt.Errorf("prelude: %w", err)}
	}
	v.Free()
	return fresh{rt: rt, sink: sink}
}

// run executes one job on a fresh runtime and returns that runtime, spent, for the
// caller to close once the reply is out.
func (w *worker) run(j job) (rep reply, spent *qjs.Runtime) {
	start := time.Now()
	f := w.take(j.MemoryBytes)
	if f.err != nil {
		return reply{Error: &Error{Kind: KindException, Message: f.err.Error()}, Unusable: true, Nanos: time.Since(start).Nanoseconds()}, nil
	}
	defer func() {
		if r := recover(); r != nil {
			// qjs panics when the wasm side traps (deep recursion, proc_exit, ...):
			// the runtime is gone, so is this worker after the reply.
			rep = reply{Error: panicError(r), Unusable: true}
		}
		rep.Logs = f.sink.lines()
		rep.Nanos = time.Since(start).Nanoseconds()
		spent = f.rt
	}()
	return w.eval(f.rt, j), f.rt
}

// eval runs the job's source and its transform call on rt.
func (w *worker) eval(rt *qjs.Runtime, j job) reply {
	v, err := rt.Eval("script.js", qjs.Code(j.Source))
	if err != nil {
		return reply{Error: jsError(err)}
	}
	v.Free()
	lit, _ := json.Marshal(string(j.Input)) // a JSON string is a JS string literal
	call := `JSON.stringify((function () {
if (typeof transform !== "function") throw new TypeError("the script must define function transform(input)");
return transform(JSON.parse(` + string(lit) + `));
})())`
	v, err = rt.Eval("call.js", qjs.Code(call))
	if err != nil {
		return reply{Error: jsError(err)}
	}
	defer v.Free()
	result := "null" // transform returned undefined or a function
	if v.IsString() {
		result = v.String()
	}
	if len(result) > w.cfg.MaxResultBytes {
		return reply{Error: invalid("result is %d bytes, over the %d byte limit", len(result), w.cfg.MaxResultBytes)}
	}
	return reply{Result: json.RawMessage(result)}
}

func closeRuntime(rt *qjs.Runtime) {
	if rt == nil {
		return
	}
	defer func() { _ = recover() }() // closing a trapped runtime panics too
	rt.Close()
}

// scriptPos finds the first frame in the user's source: "script.js:LINE:COL".
var scriptPos = regexp.MustCompile(`script\.js:(\d+):(\d+)`)

// jsError turns a QuickJS error ("TypeError: msg\n    at f (script.js:2:3)\n...") into
// an Error with the position of the innermost frame in the user's script.
func jsError(err error) *Error {
	text := err.Error()
	msg, _, _ := strings.Cut(text, "\n")
	e := &Error{Kind: KindException, Message: msg}
	switch {
	case strings.HasPrefix(msg, "SyntaxError"):
		e.Kind = KindSyntax
	case strings.Contains(msg, "out of memory"):
		e.Kind = KindMemory
	}
	if m := scriptPos.FindStringSubmatch(text); m != nil {
		e.Line, _ = strconv.Atoi(m[1])
		e.Column, _ = strconv.Atoi(m[2])
	}
	return e
}

// panicError describes a trapped runtime by the first line of the trap, e.g. "wasm
// error: out of bounds memory access" when deep recursion ran the shadow stack into
// the heap.
func panicError(r any) *Error {
	text, _, _ := strings.Cut(fmt.Sprint(r), "\n")
	if _, after, ok := strings.Cut(text, ": wasm error: "); ok {
		text = "wasm error: " + after
	}
	if strings.Contains(text, "module closed with exit_code") {
		text = "the script called exit" // std.exit, reached through import("qjs:std")
	}
	e := &Error{Kind: KindException, Message: "script aborted the runtime: " + text}
	if strings.Contains(text, "out of memory") {
		e.Kind = KindMemory
	}
	return e
}
