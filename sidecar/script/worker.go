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

type worker struct {
	cfg   setup
	sink  *logSink
	spare *qjs.Runtime // fresh runtime for the next job: no state crosses jobs
	limit int64        // MemoryLimit of spare
}

func serve(cfg setup, in *bufio.Reader, out *os.File) error {
	if cfg.GoMemoryLimit > 0 {
		debug.SetMemoryLimit(cfg.GoMemoryLimit)
	}
	w := &worker{cfg: cfg, sink: &logSink{maxBytes: cfg.MaxLogBytes, maxLines: cfg.MaxLogLines}}
	// The first runtime compiles (or loads from the cache) the QuickJS module: the cold cost.
	if err := w.prepare(cfg.MemoryBytes); err != nil {
		return err
	}
	if err := writeFrame(out, reply{Ready: true, Landlock: cfg.Landlock}); err != nil {
		return err
	}
	for {
		var j job
		if err := readFrame(in, maxJobFrame, &j); err != nil {
			return nil // the daemon closed our stdin: done
		}
		rep := w.run(j)
		if err := writeFrame(out, rep); err != nil {
			return err
		}
		if rep.Unusable {
			return fmt.Errorf("runtime unusable after: %s", rep.Error.Message)
		}
		if err := w.prepare(cfg.MemoryBytes); err != nil {
			return err
		}
	}
}

// prepare makes sure a fresh runtime with the given memory limit is waiting.
func (w *worker) prepare(limit int64) (err error) {
	if w.spare != nil && w.limit == limit {
		return nil
	}
	if w.spare != nil {
		closeRuntime(w.spare)
		w.spare = nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("new runtime: %v", r)
		}
	}()
	rt, err := qjs.New(qjs.Option{
		CWD:         w.cfg.Root,
		CacheDir:    w.cfg.CacheDir,
		MemoryLimit: int(limit),
		Stdout:      w.sink,
		Stderr:      w.sink,
	})
	if err != nil && w.cfg.CacheDir != "" {
		// An unreadable cache must not take the capability down: compile instead.
		fmt.Fprintf(os.Stderr, "script worker: compilation cache %s unusable, compiling: %v\n", w.cfg.CacheDir, err)
		w.cfg.CacheDir = ""
		return w.prepare(limit)
	}
	if err != nil {
		return fmt.Errorf("new runtime: %w", err)
	}
	v, err := rt.Eval("prelude.js", qjs.Code(prelude))
	if err != nil {
		closeRuntime(rt)
		return fmt.Errorf("prelude: %w", err)
	}
	v.Free()
	w.spare, w.limit = rt, limit
	return nil
}

// run executes one job on the spare runtime, which is spent afterwards.
func (w *worker) run(j job) (rep reply) {
	start := time.Now()
	w.sink.reset()
	defer func() {
		if r := recover(); r != nil {
			// qjs panics when the wasm side traps (deep recursion, proc_exit, ...):
			// the runtime is gone, so is this worker after the reply.
			rep = reply{Error: panicError(r), Unusable: true}
		}
		rep.Logs = w.sink.lines()
		rep.Nanos = time.Since(start).Nanoseconds()
		w.spare = nil
	}()
	if err := w.prepare(j.MemoryBytes); err != nil {
		return reply{Error: &Error{Kind: KindException, Message: err.Error()}, Unusable: true}
	}
	rt := w.spare
	defer closeRuntime(rt)
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
