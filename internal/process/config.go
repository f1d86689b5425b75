package process

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Defaults and bounds.
const (
	DefaultMaxOutputBytes = 1 << 20
	DefaultBufferBytes    = 1 << 20
	// MinBufferBytes keeps at least two full reads in a replay buffer.
	MinBufferBytes      = 2 * readSize
	DefaultMaxProcesses = 64
	DefaultMaxExecs     = 16
	// DefaultOutputBudgetBytes is 128 full-size Exec outputs (two streams of 1 MiB).
	DefaultOutputBudgetBytes = 256 << 20
	DefaultMaxExited         = 64
	DefaultRows              = 24
	DefaultCols              = 80
	MaxRows                  = 1000
	MaxCols                  = 1000
	// MaxIDLength bounds a client-chosen process id.
	MaxIDLength = 64
	// MaxTimeout bounds Timeout and IdleTimeout: a lease's processes never outlive a day
	// on one request's word.
	MaxTimeout = 24 * time.Hour
)

// outputGrace bounds how long output is still collected after the main process exited,
// for when a process it left behind keeps a pipe open; then the run is done (the reply is
// written) and later output is dropped. docs/api.md states it as part of the contract.
const outputGrace = 200 * time.Millisecond

// leftoverPace is the pause between reads of a pipe whose output is dropped (a leftover's,
// once its command is done): at most readSize per pause, ~2.6 MB/s a pipe, a few dozen reads
// a second of daemon CPU however fast the leftover writes; a faster writer waits on its
// full pipe, as on a slow terminal.
const leftoverPace = 50 * time.Millisecond

// LosslessAttachWait bounds how long a process started with StartRequest.Lossless keeps
// its output for a lossless viewer that has not come yet.
const LosslessAttachWait = apitype.LosslessAttachWaitSeconds * time.Second

// losslessTail bounds how long output is still collected after the main process exited
// while a lossless viewer keeps reading it (see run.wait): a viewer reading steadily
// behind a leftover that writes forever must not keep the process from ending.
const losslessTail = 10 * time.Second

// readSize is the size of the pooled buffers output pipes are read with, and so of a
// chunk. 128 KiB rather than 32: per-read costs (the syscall, a ring write, a reader's
// wakeup, a websocket message) dominate a fast stream; `sidecar-bench -only stream`
// measured lossless attach at 218-224 MB/s with 32 KiB reads and 270-284 MB/s with these.
// A buffer is taken only once a pipe is readable, so idle processes hold none.
const readSize = 128 << 10

// pipeSize is the capacity asked for (F_SETPIPE_SZ) of each output pipe: the kernel's
// 64 KiB would cap every read at 64 KiB. Charged to the writer, the lease's process.
const pipeSize = 256 << 10

// Config configures a Manager. Zero values take the defaults.
type Config struct {
	// Execer makes every process. Required.
	Execer Execer
	// StateDir holds one small JSON record per background process, so that a restarted
	// daemon reports processes that died with it as "lost". "" keeps records in memory
	// only (tests, dev).
	StateDir string
	// MaxOutputBytes caps each of stdout and stderr of an Exec (and of a Capture); beyond
	// it output is drained and dropped, and the result says it was truncated. Default 1 MiB.
	MaxOutputBytes int64
	// BufferBytes bounds the replay buffer of each background process, counted as
	// memory held (chunk capacity plus a per-chunk overhead), so a process that writes
	// many tiny chunks replays somewhat fewer bytes. Default 1 MiB, minimum 256 KiB
	// (MinBufferBytes).
	BufferBytes int64
	// MaxProcesses bounds the running background processes of one lease. Default 64.
	MaxProcesses int
	// MaxExecs bounds the Execs of one lease running (or replying) at once; beyond it
	// Exec fails with ErrExecLimit. Default 16.
	MaxExecs int
	// OutputBudgetBytes bounds the output all Execs and Captures (shell session commands)
	// of the daemon hold in memory at once (capture capacity, held until the reply is
	// written). A capture that cannot grow
	// within it keeps what it has and drops the rest, flagged truncated as at
	// MaxOutputBytes: a run never waits for another lease's output. Default 256 MiB.
	OutputBudgetBytes int64
	// MaxExited bounds the finished processes a lease keeps for Get, List and replay;
	// beyond it the oldest finished one is forgotten. Default 64.
	MaxExited int
	// Now is the clock for timestamps. Default time.Now. Timeouts use real timers.
	Now func() time.Time
	// Logger. Default: discard.
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Execer == nil {
		return fmt.Errorf("%w: Config.Execer is required", ErrInvalid)
	}
	if c.MaxOutputBytes < 0 || c.BufferBytes < 0 || c.MaxProcesses < 0 || c.MaxExited < 0 ||
		c.MaxExecs < 0 || c.OutputBudgetBytes < 0 {
		return fmt.Errorf("%w: negative limit in Config", ErrInvalid)
	}
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if c.BufferBytes == 0 {
		c.BufferBytes = DefaultBufferBytes
	}
	if c.BufferBytes < MinBufferBytes {
		return fmt.Errorf("%w: BufferBytes %d below the minimum %d", ErrInvalid, c.BufferBytes, MinBufferBytes)
	}
	if c.MaxProcesses == 0 {
		c.MaxProcesses = DefaultMaxProcesses
	}
	if c.MaxExecs == 0 {
		c.MaxExecs = DefaultMaxExecs
	}
	if c.OutputBudgetBytes == 0 {
		c.OutputBudgetBytes = DefaultOutputBudgetBytes
	}
	if c.MaxExited == 0 {
		c.MaxExited = DefaultMaxExited
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}
