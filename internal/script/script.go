// Package script runs untrusted JavaScript transforms (QuickJS via fastschema/qjs) for
// workflow transform.script steps, so that a runaway script can never hang, crash or bloat
// the daemon.
//
// JavaScript never runs in the daemon process. A Runner keeps a small pool of warm worker
// processes (the daemon's own binary run as a hidden subcommand that calls WorkerMain),
// each serving one script at a time over a length-prefixed JSON protocol on its
// stdin/stdout. A worker runs as an unprivileged uid with no_new_privs, a Landlock
// domain (no files but its binary, libraries, the empty root and the compilation cache;
// no TCP; no signals out), the lease processes' seccomp filter, a clean environment and
// no inherited descriptors, inside its own memory cgroup of Config.Cell (RLIMIT_DATA
// without one), where the kernel kills it when it goes over its script's budget. Every script gets a
// fresh QuickJS runtime, so nothing crosses from one script to the next, whose WASI root
// is an empty read-only directory and whose std/os globals are deleted. A worker makes
// those runtimes ahead, a few at a time, while it has no job (a runtime costs ~3 ms of
// CPU, a warm call well under one): each serves one script and is closed after the reply.
// Only a burst that drains them, or a job asking for a memory limit other than the
// default (QuickJS fixes it at creation), makes a runtime on the caller's time. A worker
// that overruns its time or memory, or whose runtime panics, is killed and replaced.
package script

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Defaults and ceilings for Config.
const (
	DefaultWorkers            = 2
	DefaultWorkerIdle         = time.Minute
	DefaultTimeout            = time.Second
	DefaultMaxTimeout         = 30 * time.Second
	DefaultMemoryBytes        = 64 << 20
	DefaultMaxMemoryBytes     = 512 << 20
	DefaultMaxSourceBytes     = 256 << 10
	DefaultMaxInputBytes      = 8 << 20
	DefaultMaxResultBytes     = 8 << 20
	DefaultMaxLogBytes        = 64 << 10
	DefaultMaxLogLines        = 1000
	DefaultWorkerUID          = 65534 // nobody
	minMemoryBytes            = 1 << 20
	workerSubcommand          = "__script-worker"
	workerSubcommandEnvMarker = "SIDECAR_SCRIPT_WORKER_STAGE"
)

// Config configures a Runner. Zero fields take the defaults above.
type Config struct {
	Enabled bool
	Workers int // pool size, default 2
	// WorkerIdle is how long a worker beyond the first stays without a script before it
	// is retired (the first always stays); default DefaultWorkerIdle.
	WorkerIdle time.Duration
	// MaxPerLease is how many workers one lease's scripts hold at once (the shared
	// token's are not capped); default half the pool, at least 1.
	MaxPerLease int
	// QueueWait bounds how long a script waits for a worker before Run gives up with
	// ErrBusy; its own timeout starts only once it runs. Default MaxTimeout + 5 s: time
	// for the longest script ahead of it (fair turns and MaxPerLease keep it to one) and
	// for a worker to start.
	QueueWait  time.Duration
	HelperPath string // binary whose WorkerArgs start a worker; default os.Executable()
	// WorkerArgs are the arguments that make HelperPath run WorkerMain; default
	// ["__script-worker"].
	WorkerArgs                         []string
	DefaultTimeout, MaxTimeout         time.Duration // default 1s, max 30s
	DefaultMemoryBytes, MaxMemoryBytes int64         // default 64 MiB, max 512 MiB
	MaxSourceBytes, MaxInputBytes      int           // 256 KiB, 8 MiB
	MaxResultBytes                     int           // 8 MiB: JSON of the returned value
	MaxLogBytes, MaxLogLines           int           // 64 KiB, 1000 lines per run
	// CacheDir holds wazero's compilation cache so that a new worker starts in ~0.3 s
	// instead of ~1.4 s. Empty: a private temporary directory removed by Close.
	CacheDir string
	// Cell bounds the workers' memory with the kernel: each worker runs in a child
	// cgroup of it limited to its script's budget, and the cell to the pool's. The daemon
	// passes a confine.Cell, a cgroup under its cgroup parent (v1 or v2); the Runner owns
	// it from New on and removes it on Close. nil: RLIMIT_DATA and an RSS watchdog bound
	// the workers (a daemon that is not root, or runs without isolation).
	Cell Cell
	// WorkerUID/WorkerGID run workers when the daemon is root; default 65534 (nobody).
	WorkerUID, WorkerGID int
	// Seccomp is "strict" (default): workers run under the lease processes' system-call
	// filter (package seccomp); or "off".
	Seccomp string
	Logger  *slog.Logger
}

// Cell is the cgroup the workers run in: package confine's Cell, which the same cgroup
// code as the leases' makes (v1 or v2). A child is a worker's own cgroup.
type Cell interface {
	SetMemory(bytes int64) error
	NewChild(child string, memoryBytes int64) error
	SetChildMemory(child string, bytes int64) error
	Join(child string, pid int) error
	OOMKills(child string) int64
	RemoveChild(ctx context.Context, child string) error
	Remove(ctx context.Context) error
}

// Request is one script run.
type Request struct {
	Source      string          // defines function transform(input)
	Input       json.RawMessage // passed to transform; empty means null
	Timeout     time.Duration   // 0: Config.DefaultTimeout
	MemoryBytes int64           // 0: Config.DefaultMemoryBytes
	// Lease is the lease whose token asked, "" for the shared token: callers take turns
	// for the workers, and a lease holds at most Config.MaxPerLease of them.
	Lease string
}

// Result is a successful run.
type Result struct {
	Result   json.RawMessage // JSON of transform's return value (null for undefined)
	Logs     []string        // console.log lines, bounded by MaxLogBytes/MaxLogLines
	Duration time.Duration   // time the worker spent on the script
}

// Error kinds.
const (
	KindSyntax    = "syntax"
	KindException = "exception"
	KindTimeout   = "timeout"
	KindMemory    = "memory"
	KindInvalid   = "invalid"
)

// Error is a script's own failure: the HTTP layer answers 422 with Code().
type Error struct {
	Kind    string `json:"kind"` // syntax, exception, timeout, memory, invalid
	Message string `json:"message"`
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("script %s error at %d:%d: %s", e.Kind, e.Line, e.Column, e.Message)
	}
	return fmt.Sprintf("script %s error: %s", e.Kind, e.Message)
}

// Code is the stable wire code for the error: script_timeout or script_error.
func (e *Error) Code() string {
	if e.Kind == KindTimeout {
		return apitype.CodeScriptTimeout
	}
	return apitype.CodeScriptError
}

var (
	// ErrDisabled is returned by Run when the capability is off (404 capability_disabled).
	ErrDisabled = errors.New("script: capability disabled")
	// ErrClosed is returned by Run after Close (503 unavailable).
	ErrClosed = errors.New("script: runner closed")
)

func invalid(format string, a ...any) *Error {
	return &Error{Kind: KindInvalid, Message: fmt.Sprintf(format, a...)}
}
