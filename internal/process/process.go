package process

import (
	"fmt"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Process is a background process of a lease, running or finished (or lost with a
// previous daemon).
type Process struct {
	id, lease string
	argv      []string
	tty       bool
	startedAt time.Time
	log       *outLog
	stop      <-chan struct{} // the Manager's shutdown, for subscriptions

	ready    chan struct{} // closed when Start finished, either way
	startErr error         // set before ready closes
	run      *run          // set before ready closes; nil for a lost process

	mu         sync.Mutex
	state      string
	exit       *int
	signal     string
	timedOut   bool
	oomKilled  bool
	endedAt    *time.Time
	rows, cols uint16

	done chan struct{} // closed once the status is final and the output has ended
}

// ID is the daemon's id of the process (the wire's "pid").
func (p *Process) ID() string { return p.id }

// TTY reports whether the process runs on a PTY (its output is all on stdout).
func (p *Process) TTY() bool { return p.tty }

// Done is closed once the process has ended: its status is final and its output
// complete, so a Subscription at the end gets io.EOF.
func (p *Process) Done() <-chan struct{} { return p.done }

// Status is the process as the API shows it.
func (p *Process) Status() apitype.Process {
	start, end := p.log.offsets()
	p.mu.Lock()
	defer p.mu.Unlock()
	s := apitype.Process{
		PID:          p.id,
		Argv:         append([]string(nil), p.argv...),
		TTY:          p.tty,
		State:        p.state,
		Signal:       p.signal,
		TimedOut:     p.timedOut,
		OOMKilled:    p.oomKilled,
		StartedAt:    p.startedAt,
		OutputOffset: end,
		OutputStart:  start,
	}
	if p.exit != nil {
		code := *p.exit
		s.ExitCode = &code
	}
	if p.endedAt != nil {
		t := *p.endedAt
		s.EndedAt = &t
	}
	return s
}

// running reports whether the process counts against MaxProcesses (a process still
// starting does).
func (p *Process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state == apitype.ProcessRunning
}

// started reports whether Start finished successfully, without blocking.
func (p *Process) started() bool {
	select {
	case <-p.ready:
		return p.startErr == nil
	default:
		return false
	}
}

func (p *Process) record() record {
	st := p.Status()
	return record{
		Lease: p.lease, ID: p.id, Argv: st.Argv, TTY: st.TTY, State: st.State,
		StartedAt: st.StartedAt, EndedAt: st.EndedAt, ExitCode: st.ExitCode,
		Signal: st.Signal, TimedOut: st.TimedOut, OOMKilled: st.OOMKilled,
	}
}

// WriteStdin writes to the process's stdin (for a TTY, to the terminal). It may block
// while the process does not read. ErrStdinClosed after CloseStdin, after the process
// ended, or when it was started without stdin.
func (p *Process) WriteStdin(b []byte) (int, error) {
	if p.run == nil {
		return 0, ErrStdinClosed
	}
	return p.run.writeStdin(b)
}

// CloseStdin ends the process's input. A pipe is closed. A TTY gets its EOF character
// (VEOF, normally ^D), twice when the last byte written did not end a line (the first
// only flushes the partial line), which a program reading in canonical mode sees as
// end of input. Calling it again is a no-op; ErrStdinClosed without stdin.
func (p *Process) CloseStdin() error {
	if p.run == nil {
		return ErrStdinClosed
	}
	return p.run.closeStdin()
}

// Resize sets the terminal size of a TTY process; rows in 1..MaxRows, cols in
// 1..MaxCols. ErrInvalid for a non-TTY process or a size out of bounds, ErrExited
// once it ended.
func (p *Process) Resize(rows, cols uint16) error {
	if !p.tty {
		return fmt.Errorf("%w: process %s has no TTY", ErrInvalid, p.id)
	}
	if err := CheckSize(rows, cols); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != apitype.ProcessRunning || p.run == nil {
		return ErrExited
	}
	if err := setSize(p.run.pty, rows, cols); err != nil {
		return fmt.Errorf("process: resize: %w", err)
	}
	p.rows, p.cols = rows, cols
	return nil
}

// Redraw asks a TTY program to repaint its screen, by nudging the terminal size: to
// rows x cols+1 and straight back (cols-1 at MaxCols). Each change sends SIGWINCH to
// the terminal's foreground process group; full-screen programs and shells repaint on
// it. A program that compares sizes may see the final, unchanged size and skip the
// repaint; there is no better portable trigger. A no-op for non-TTY or ended processes.
func (p *Process) Redraw() error {
	if !p.tty {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != apitype.ProcessRunning || p.run == nil {
		return nil
	}
	nudge := p.cols + 1
	if p.cols >= MaxCols {
		nudge = p.cols - 1
	}
	if err := setSize(p.run.pty, p.rows, nudge); err != nil {
		return fmt.Errorf("process: redraw: %w", err)
	}
	if err := setSize(p.run.pty, p.rows, p.cols); err != nil {
		return fmt.Errorf("process: redraw: %w", err)
	}
	return nil
}

// Subscribe returns a lossy reader of the output from offset since: the process never
// waits for it, and bytes that leave the replay buffer before it reads them are counted
// by Lost. Offsets:
//   - since = -1: from the current end (live output only);
//   - OutputStart <= since <= OutputOffset: from exactly there;
//   - since < OutputStart: from OutputStart, with Lost() = OutputStart - since;
//   - since > OutputOffset, or below -1: ErrInvalid.
//
// A running TTY process is not replayed blindly: with since = -1 or a lost range, the
// subscription starts at the current end (Lost() counts the skipped range) and Redraw
// is called, so the screen is repainted instead of replaying half an escape sequence.
// An exact resume on a TTY replays the bytes. For a TTY that has ended nothing can
// repaint, so a lost range replays from OutputStart like a pipe. A process known only
// from a previous daemon's record has no output: any since gives io.EOF at once.
func (p *Process) Subscribe(since int64) (*Subscription, error) {
	return p.subscribe(since, false)
}

// SubscribeLossless is Subscribe for a viewer that must get every byte from where it
// starts: a writer that would drop a byte it has not read waits instead, so a slow
// reader slows the process (its pipe fills and its writes block), for every viewer.
// The replay buffer is the only queue: memory stays within Config.BufferBytes. Close
// lets the process go on; so does the end of the run (see doc.go). Bytes already gone
// when it subscribes are counted by Lost as with Subscribe. It takes over the hold of a
// StartRequest.Lossless process.
func (p *Process) SubscribeLossless(since int64) (*Subscription, error) {
	return p.subscribe(since, true)
}

func (p *Process) subscribe(since int64, lossless bool) (*Subscription, error) {
	if since < -1 {
		return nil, fmt.Errorf("%w: since %d", ErrInvalid, since)
	}
	s := &Subscription{log: p.log, stop: p.stop, closed: make(chan struct{})}
	live := p.run != nil && p.tty && p.running()
	redraw := false
	p.log.mu.Lock()
	start, end := p.log.start, p.log.end
	switch {
	case p.run == nil:
		// Known only from its record (a previous daemon's): no output is left, and the
		// client's offset cannot be checked, so it just gets the end.
		s.pos = end
	case since > end:
		p.log.mu.Unlock()
		return nil, fmt.Errorf("%w: since %d is beyond the output offset %d", ErrInvalid, since, end)
	case since == -1:
		s.pos = end
		redraw = live
	case since < start && live:
		s.pos = end
		s.lost.Store(end - since)
		redraw = true
	case since < start:
		s.pos = start
		s.lost.Store(start - since)
	default:
		s.pos = since
	}
	if lossless && p.run != nil {
		// Made with the position, under the same lock: no write can drop what lies between.
		s.hold = p.log.subscribeHold(s.pos)
	}
	p.log.mu.Unlock()
	if redraw {
		if err := p.Redraw(); err != nil {
			p.run.logger.Warn("redraw on attach", "pid", p.id, "err", err)
		}
	}
	return s, nil
}

// CheckSize validates a terminal size: rows in 1..MaxRows, cols in 1..MaxCols.
func CheckSize(rows, cols uint16) error {
	if rows < 1 || rows > MaxRows || cols < 1 || cols > MaxCols {
		return fmt.Errorf("%w: terminal size %dx%d outside 1..%d x 1..%d", ErrInvalid, rows, cols, MaxRows, MaxCols)
	}
	return nil
}
