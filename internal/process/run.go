package process

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"golang.org/x/sys/unix"
)

// output receives what a command writes, one read at a time. Each stream is pumped by
// its own goroutine, so write is called concurrently for different channels.
type output interface {
	// write reports whether it woke a reader.
	write(channel byte, p []byte) (woke bool)
}

// heldOutput is an output whose write may wait for its readers (outLog, with a lossless
// subscription), which the run must let go of at its end.
type heldOutput interface {
	output
	// holding reports whether a write waited for, or went to, a lossless reader since
	// the last call.
	holding() bool
	// releaseWriters ends the waiting for good.
	releaseWriters()
}

// readBufs are the pooled buffers output is read with; output copies what it keeps.
var readBufs = sync.Pool{New: func() any { b := make([]byte, readSize); return &b }}

// runOptions says how to wire up one command.
type runOptions struct {
	spec       Spec
	rows, cols uint16 // TTY size, already validated
	// stdinPipe keeps stdin open for writeStdin; otherwise stdinFrom is copied in and
	// closed, and with neither stdin is empty (/dev/null), never inherited.
	stdinPipe bool
	stdinFrom io.Reader
	// killLeftovers kills what the command leaves behind once its main process exits;
	// otherwise it stays in the lease (package sandbox's leftovers).
	killLeftovers bool
}

// run is one started command: its pipes or PTY, the goroutines pumping its output, and
// the wait that ends it. Exec and background processes share it.
type run struct {
	cmd    *exec.Cmd
	tree   Tree
	pty    *os.File   // PTY master (pollable); nil without a TTY
	stdin  *os.File   // stdin pipe's write end, or the PTY master; nil without stdin
	outs   []*os.File // what the pumps read; a pipe's pump closes it at its end
	out    *gate      // where the pumps write, until the run is done
	logger *slog.Logger

	killLeftovers bool

	started    time.Time    // monotonic base of the idle clock
	lastOutput atomic.Int64 // nanoseconds after started of the latest output
	timedOut   atomic.Bool
	canceled   atomic.Bool // killed because the caller's context ended
	pumps      sync.WaitGroup
	in         stdinState

	exited chan struct{} // main process waited for; status is set
	status exitStatus
	done   chan struct{} // output drained, tree closed; oom is set
	oom    bool
}

type exitStatus struct {
	code   int
	signal string
}

// startRun makes the command through the Execer, wires it up and starts it. Output goes
// to out on apitype.ChannelStdout (1) and ChannelStderr (2). then, if not nil, runs once
// the run is done (on the goroutine that waited for it, saving one per process).
func startRun(execer Execer, leaseID string, o runOptions, out output, then func(), logger *slog.Logger) (*run, error) {
	cmd, tree, err := execer.Command(leaseID, o.spec)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}
	r := &run{cmd: cmd, tree: tree, logger: logger, out: &gate{out: out}, killLeftovers: o.killLeftovers,
		exited: make(chan struct{}), done: make(chan struct{})}
	var childEnds []*os.File // closed in the parent once the child has them
	fail := func(err error) (*run, error) {
		for _, f := range childEnds {
			_ = f.Close()
		}
		for _, f := range r.outs {
			_ = f.Close()
		}
		if r.stdin != nil && r.stdin != r.pty {
			_ = r.stdin.Close()
		}
		if r.pty != nil {
			_ = r.pty.Close()
		}
		if cerr := tree.Close(); cerr != nil {
			logger.Warn("closing tree of a command that did not start", "err", cerr)
		}
		return nil, fmt.Errorf("%w: %w", ErrStart, err)
	}

	if o.spec.TTY {
		master, slave, err := openPTY(execer, leaseID, o.rows, o.cols)
		if err != nil {
			return fail(err)
		}
		r.pty, r.outs = master, []*os.File{master}
		childEnds = append(childEnds, slave)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		// A controlling terminal needs a session leader, which is its own group
		// leader, so the process group stays the command's own.
		cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setpgid = true, false
		cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, 0
		if o.stdinPipe || o.stdinFrom != nil {
			r.stdin = master
		}
	} else {
		for _, target := range []*io.Writer{&cmd.Stdout, &cmd.Stderr} {
			pr, pw, err := os.Pipe()
			if err != nil {
				return fail(err)
			}
			r.outs = append(r.outs, pr)
			childEnds = append(childEnds, pw)
			*target = pw
		}
		cmd.Stdin = nil // /dev/null
		if o.stdinPipe || o.stdinFrom != nil {
			pr, pw, err := os.Pipe()
			if err != nil {
				return fail(err)
			}
			childEnds = append(childEnds, pr)
			cmd.Stdin, r.stdin = pr, pw
		}
	}
	if err := tree.Start(); err != nil {
		return fail(err)
	}
	for _, f := range childEnds {
		_ = f.Close()
	}
	r.started = time.Now()
	for i, f := range r.outs {
		r.pumps.Add(1)
		go r.pump(f, apitype.ChannelStdout+byte(i), r.out) // stdout, then stderr
	}
	r.in.atLineStart = true
	if o.stdinFrom != nil {
		go r.feed(o.stdinFrom)
	}
	go r.wait(then)
	return r, nil
}

// openPTY opens a PTY of the given size, from the lease's own PTYs when the Execer has
// them. The master is re-made as a non-blocking, pollable file (creack/pty's is blocking,
// as Fd makes it): that lets wait stop a read with a deadline, and Close unblock it.
func openPTY(execer Execer, leaseID string, rows, cols uint16) (master, slave *os.File, err error) {
	var m *os.File
	if p, ok := execer.(PTYOpener); ok {
		m, slave, err = p.OpenPTY(leaseID)
	} else {
		m, slave, err = pty.Open()
	}
	if err != nil {
		return nil, nil, err
	}
	// F_DUPFD_CLOEXEC: the copy is never inherited by a command started meanwhile.
	fd, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	_ = m.Close()
	if err == nil {
		if err = unix.SetNonblock(fd, true); err != nil {
			_ = unix.Close(fd)
		}
	}
	if err != nil {
		_ = slave.Close()
		return nil, nil, err
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	if err := setSize(master, rows, cols); err != nil {
		_ = master.Close()
		_ = slave.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// setSize sets a PTY's window size; the kernel sends SIGWINCH to the foreground
// process group when it changes.
func setSize(f *os.File, rows, cols uint16) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	})
	return errors.Join(err, ioErr)
}

// pump copies one output stream to out until it ends, then closes a pipe (wait closes
// the PTY master, which is also stdin). EIO on a PTY master means every slave descriptor
// is closed: the end of output, not an error.
func (r *run) pump(f *os.File, channel byte, out output) {
	defer r.pumps.Done()
	if f != r.pty {
		defer f.Close()
	}
	rc, err := f.SyscallConn()
	if err != nil {
		r.logger.Warn("reading process output", "err", err)
		return
	}
	if f != r.pty {
		// Best effort: a host whose pipe-max-size is lower keeps its default pipes.
		_ = rc.Control(func(fd uintptr) { _, _ = unix.FcntlInt(fd, unix.F_SETPIPE_SZ, pipeSize) })
	}
	pr := &pooledReader{rc: rc}
	pr.readFD = pr.read // one method value per pump, not one closure per read
	for {
		p, err := pr.next()
		if len(p) > 0 {
			r.lastOutput.Store(int64(time.Since(r.started)))
			woke := out.write(channel, p)
			// A lossless viewer may have made the write wait: the process was blocked
			// on its pipe meanwhile, not idle.
			r.lastOutput.Store(int64(time.Since(r.started)))
			if woke {
				// Let the woken reader run now. Reads from a full pipe never park this
				// goroutine, so otherwise the reader waits for preemption (10 ms)
				// while the ring overwrites what it was about to read.
				runtime.Gosched()
			}
		}
		pr.release()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EIO) &&
				!errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, os.ErrClosed) {
				r.logger.Warn("reading process output", "err", err)
			}
			return
		}
		if r.out.detached() {
			// A leftover writes to a pipe nobody keeps: read it at leftoverPace, so that
			// it waits on its full pipe instead of the daemon spending a core on copying
			// its output to nowhere.
			time.Sleep(leftoverPace)
		}
	}
}

// pooledReader reads a non-blocking file into pooled buffers, taking a buffer only once
// data is there, so an idle process holds no read buffer while it waits.
type pooledReader struct {
	rc     syscall.RawConn
	readFD func(fd uintptr) bool
	buf    *[]byte
	n      int
	err    error
}

// next returns the bytes of one read, valid until release; io.EOF at the end.
func (pr *pooledReader) next() ([]byte, error) {
	pr.n, pr.err = 0, nil
	if err := pr.rc.Read(pr.readFD); err != nil {
		return nil, err
	}
	switch {
	case pr.err != nil:
		return nil, pr.err
	case pr.n == 0:
		return nil, io.EOF
	}
	return (*pr.buf)[:pr.n], nil
}

// read is the RawConn callback: false means "wait until readable".
func (pr *pooledReader) read(fd uintptr) bool {
	pr.buf = readBufs.Get().(*[]byte)
	for {
		pr.n, pr.err = unix.Read(int(fd), *pr.buf)
		if pr.err != unix.EINTR {
			break
		}
	}
	if pr.err == unix.EAGAIN {
		pr.release()
		return false
	}
	return true
}

func (pr *pooledReader) release() {
	if pr.buf != nil {
		readBufs.Put(pr.buf)
		pr.buf = nil
	}
}

// feed copies an Exec's stdin in and closes it. It is not waited for: a reader that
// blocks is the caller's to unblock (closing it); the write end is closed at the end of
// the run, so a blocked write fails then.
func (r *run) feed(from io.Reader) {
	_, _ = io.Copy(stdinWriter{r}, from)
	_ = r.closeStdin()
}

// wait waits for the main process, then for its output for at most outputGrace (a
// process it left behind may hold a pipe), then closes the tree. With killLeftovers the
// tree is killed first and what that left in the pipes is read (again bounded by
// outputGrace). Either way output stops being kept then: a leftover still holding a pipe
// is drained to nowhere, so it never blocks on a full pipe nor dies of EPIPE, until it
// closes it or dies with the lease. A PTY is closed instead: a leftover keeps no terminal
// (its session leader is gone).
func (r *run) wait(then func()) {
	err := r.cmd.Wait() // our own pipes: Wait does not wait for them
	r.status = exitStatusOf(r.cmd.ProcessState, err)
	close(r.exited)

	drained := make(chan struct{})
	go func() { r.pumps.Wait(); close(drained) }()
	r.drain(drained)
	r.oom = r.tree.OOMKilled()
	if r.killLeftovers {
		if err := r.tree.Kill(); err != nil {
			r.logger.Warn("killing what a process left behind", "err", err)
		}
		r.drain(drained)
	}
	r.out.detach()
	if err := r.tree.Close(); err != nil {
		r.logger.Warn("closing process tree", "err", err)
	}
	if r.stdin != nil {
		_ = r.stdin.Close()
	}
	if r.pty != nil {
		_ = r.pty.Close() // ends its pump
	}
	close(r.done)
	if then != nil {
		then()
	}
}

// drain waits for the pumps to finish (drained) for outputGrace, and longer while
// output still goes to a lossless viewer (or the pump waits for one), at most
// losslessTail in all. A leftover holding a pipe ends the wait after one grace, as
// without a lossless viewer; a stalled viewer is cut by its own write timeout, which
// lets the pump go.
func (r *run) drain(drained <-chan struct{}) {
	bp, _ := r.out.out.(heldOutput)
	grace := time.NewTimer(outputGrace)
	defer grace.Stop()
	deadline := time.Now().Add(losslessTail)
	for {
		select {
		case <-drained:
			return
		case <-grace.C:
		}
		if bp == nil || !bp.holding() || time.Now().After(deadline) {
			return
		}
		grace.Reset(outputGrace)
	}
}

// gate passes output on until detach, and drops it after: the capture or replay buffer
// of a run that is done must not change, whoever still writes to its pipes.
type gate struct {
	mu   sync.Mutex
	out  output
	off  bool
	gone atomic.Bool // off, read without waiting for a write held by a lossless viewer
}

func (g *gate) write(channel byte, p []byte) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.off {
		return false
	}
	return g.out.write(channel, p)
}

func (g *gate) detached() bool { return g.gone.Load() }

// detach drops all later output; once it returns no write is in progress. A write
// waiting for a lossless reader (outLog) is let go first.
func (g *gate) detach() {
	if h, ok := g.out.(heldOutput); ok {
		h.releaseWriters()
	}
	g.mu.Lock()
	g.off = true
	g.gone.Store(true)
	g.mu.Unlock()
}

// supervise kills the tree (marking timedOut) when timeout passes or no output came for
// idle, and kills it (unmarked) when cancel closes. It returns once the main process
// exited, or when stop closes (shutdown: the process is left alone).
func (r *run) supervise(timeout, idle time.Duration, cancel, stop <-chan struct{}) {
	if timeout <= 0 && idle <= 0 && cancel == nil {
		return
	}
	var timer *time.Timer
	var fire <-chan time.Time
	if timeout > 0 || idle > 0 {
		timer = time.NewTimer(time.Hour)
		defer timer.Stop()
		fire = timer.C
	}
	for {
		if timer != nil {
			timer.Reset(time.Until(r.nextDeadline(timeout, idle)))
		}
		select {
		case <-r.exited:
			return
		case <-stop:
			return
		case <-cancel:
			r.canceled.Store(true)
			r.kill(false)
			return
		case <-fire:
			if !time.Now().Before(r.nextDeadline(timeout, idle)) {
				r.kill(true)
				return
			}
		}
	}
}

// nextDeadline is the earlier of the hard deadline and the idle deadline.
func (r *run) nextDeadline(timeout, idle time.Duration) time.Time {
	var d time.Time
	if timeout > 0 {
		d = r.started.Add(timeout)
	}
	if idle > 0 {
		i := r.started.Add(time.Duration(r.lastOutput.Load()) + idle)
		if d.IsZero() || i.Before(d) {
			d = i
		}
	}
	return d
}

func (r *run) kill(timedOut bool) {
	if timedOut {
		r.timedOut.Store(true)
	}
	if err := r.tree.Kill(); err != nil {
		r.logger.Warn("killing process tree", "err", err)
	}
}

// exitStatusOf turns a wait status into an exit code and signal name; a signal gives
// 128+signo as the code, as shells do.
func exitStatusOf(ps *os.ProcessState, err error) exitStatus {
	if ps == nil {
		return exitStatus{code: -1}
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return exitStatus{code: 128 + int(ws.Signal()), signal: SignalName(ws.Signal())}
	}
	return exitStatus{code: ps.ExitCode()}
}
