package confine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

// Launchers take the confinement's set-up off the exec path. Starting a command the plain
// way forks the helper, which joins its child cgroup (on v1 a migration that, after a few
// tens of milliseconds of idle, waits out an RCU grace period: 6-8 ms), mounts the cell's view,
// drops to its uid and builds its Landlock and seccomp filters, then execs. A launcher is
// that helper started ahead of time, in the background, for the cell's next command: born
// in an empty child cgroup of its own (children.go), it does every step but the exec and
// waits on a socket (initproc/launch.go). A command then costs one message and the exec of
// its target, and still starts in its own cgroup, namespaces and Landlock domain before its
// first instruction.
//
// Each cell with a template (SetTemplate) keeps one launcher, made when the template is set
// and again for each command that takes one, once the cell is quiet (awaitQuiet: an
// agent's commands come with gaps). Made while a short command runs, it would slow that
// command: on two CPUs the helper's set-up and the command share them. A launcher is a
// process of the cell (one of its pids, ~100 KiB of its memory; Usage leaves its pid out),
// running as the cell's uid: `ps` in a lease shows it as sidecar-init. It holds nothing of
// another command: what a command could do to it, it could do to its own next command
// anyway.

// launchersAtOnce bounds the launchers being made at once, daemon-wide: a restart adopting
// a thousand cells makes theirs a few at a time, not a thousand forks in one go.
const launchersAtOnce = 4

// launcherAfterReply is how long after a command ends (or a cell is made) its next
// launcher waits: the reply goes out first. Measured on 2 CPUs, an exec after 50 ms of
// idle: 7.8 ms with the launcher made at once as the command ended, 7.0 ms with this wait,
// 9.4 ms with it made as the command started.
const launcherAfterReply = 3 * time.Millisecond

// launcherWhileRunning is how long a command runs before the next launcher is made anyway,
// for a command that comes while it still runs (a server started in the background).
const launcherWhileRunning = 20 * time.Millisecond

// launcherCatchUp is how long a command waits for a launcher that is already being forked
// and set up (a few ms when idle) before it starts the plain way.
const launcherCatchUp = 15 * time.Millisecond

// maxLauncherFailures is how many launchers in a row may fail before a cell stops making
// them (a cell at its pids limit, say): its commands start the plain way, and each one
// that does allows one more try.
const maxLauncherFailures = 3

type launcher struct {
	child   string      // its child cgroup
	proc    *os.Process // nil until started
	sock    *os.File    // the daemon's end of the launch socket
	report  *os.File    // read end of its report pipe
	made    chan struct{}
	forking atomic.Bool // past awaitQuiet and launchersAtOnce: being forked and set up
	err     error       // why it could not be started; set before made closes

	cancel     chan struct{} // closed by dropLauncher: not to be made after all
	cancelOnce sync.Once
}

// errLauncherCanceled: the cell went before its launcher was made.
var errLauncherCanceled = errors.New("launcher no longer needed")

// started says l is running (ready or getting there); false for nil.
func (l *launcher) started() bool {
	if l == nil {
		return false
	}
	select {
	case <-l.made:
		return l.err == nil
	default:
		return false
	}
}

// tasks is how many of the cell's pids a launcher or zygote holds: one for the C helper,
// which never starts a thread (an inspection need not ask /proc); the Go one's runtime
// starts threads as it goes.
func (e *Engine) tasks(p *os.Process) int64 {
	if e.forks {
		return 1
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid)) // not reaped: the pid is still its
	if err != nil {
		return 0
	}
	_, rest, _ := strings.Cut(string(b), "\nThreads:")
	n, _ := strconv.ParseInt(strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0]), 10, 64)
	return n
}

// noteCommand records a command that is about to start as the cell's last (ended closes
// when it is over), before it starts: a launcher waiting for quiet (awaitQuiet) then
// waits for this command too instead of being made beside its plain start. Noted after
// the start, a launcher whose quiet timer ran out meanwhile would be forked beside the
// plain start, and the two would share the CPUs.
func (e *Engine) noteCommand(c *cell, ended <-chan struct{}) {
	e.mu.Lock()
	c.lastCommand = ended
	e.mu.Unlock()
}

// refillLauncher makes the cell's next launcher in the background if it has none and may
// have one, once the cell is quiet after the command whose end is ended (nil: none;
// noteCommand recorded it as the cell's last). A command that comes while it waits for
// quiet starts the plain way; one that comes while it is forked catches up with it
// (takeLauncher).
func (e *Engine) refillLauncher(c *cell, ended <-chan struct{}) {
	if c == nil || e.coldStart {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.template == nil || c.launcher != nil || c.launcherFailures >= maxLauncherFailures || e.live(c.id) != c {
		return
	}
	l := &launcher{made: make(chan struct{}), cancel: make(chan struct{})}
	c.launcher = l
	c.jobs.Go(func() {
		defer close(l.made)
		if !e.awaitQuiet(c, l, ended) {
			l.err = errLauncherCanceled
			return
		}
		e.launching <- struct{}{}
		defer func() { <-e.launching }()
		l.forking.Store(true)
		if l.err = e.startLauncher(c, l); l.err != nil {
			e.launcherFailed(c, l)
		}
	})
}

// awaitQuiet waits until the cell is quiet enough to make launcher l: ended has closed
// (or the command has run for launcherWhileRunning), then launcherAfterReply has passed
// without another command starting; a command that did start is waited for the same way.
// Back-to-back commands thus start the plain way without a launcher being made beside
// them. False if l was canceled meanwhile.
func (e *Engine) awaitQuiet(c *cell, l *launcher, ended <-chan struct{}) bool {
	for {
		if ended != nil {
			running := time.NewTimer(launcherWhileRunning)
			select {
			case <-ended:
			case <-running.C:
			case <-l.cancel:
			}
			running.Stop()
		}
		reply := time.NewTimer(launcherAfterReply)
		select {
		case <-reply.C:
		case <-l.cancel:
			reply.Stop()
			return false
		}
		e.mu.Lock()
		latest := c.lastCommand
		e.mu.Unlock()
		if latest == ended {
			return true
		}
		ended = latest
	}
}

// startLauncher makes a launcher in a new child cgroup: forked by the cell's zygote
// (zygote.go) when it can have one, else the helper forked by the daemon.
func (e *Engine) startLauncher(c *cell, l *launcher) error {
	child, err := e.takeChild(c.id)
	if err != nil {
		return fmt.Errorf("child cgroup: %w", err)
	}
	l.child = child
	e.mu.Lock()
	template := c.template
	e.mu.Unlock()
	st := template()
	if z := e.zygoteFor(c, st); z != nil {
		err := e.forkLauncher(c, z, l)
		if err == nil || !errors.Is(err, errZygote) {
			return err
		}
		e.log.Debug("zygote failed: this launcher is made the plain way", "cell", c.id, "err", err)
		e.zygoteFailed(c, z)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("launch socket: %w", err)
	}
	l.sock = os.NewFile(uintptr(fds[0]), "launch")
	theirs := os.NewFile(uintptr(fds[1]), "launch")
	defer theirs.Close()
	st.Config.Await = true
	cmd := e.helperCmd(st)
	parentFiles, report, err := e.prepareHelper(c.id, cmd, st, child, theirs)
	if err != nil {
		return err
	}
	l.report = report
	if err := e.startHelper(c.id, cmd, child, parentFiles); err != nil {
		return err
	}
	l.proc = cmd.Process
	return nil
}

// takeLauncher returns the cell's launcher once it is ready, else nil: a command never
// waits for a launcher that has not been forked yet (one waiting for quiet, or behind
// launchersAtOnce: that wait would cost what a plain start costs, or far more while others
// are made). One already forked is waited for up to launcherCatchUp: a plain start beside
// it would share the CPUs with it and pay the whole set-up again, where waiting pays only
// the rest of the launcher's. One not ready by then stays for a later command; a dead one
// is discarded, and the cell may make a new one.
func (e *Engine) takeLauncher(c *cell) *launcher {
	e.mu.Lock()
	l := c.launcher
	e.mu.Unlock()
	if l == nil {
		return nil
	}
	deadline := time.Now().Add(launcherCatchUp)
	select {
	case <-l.made:
	default:
		if !l.forking.Load() {
			return nil
		}
		catchUp := time.NewTimer(launcherCatchUp)
		defer catchUp.Stop()
		select {
		case <-l.made:
		case <-catchUp.C:
			return nil
		}
	}
	e.mu.Lock()
	if c.launcher != l { // another command took it, or the cell is going
		e.mu.Unlock()
		return nil
	}
	c.launcher = nil
	e.mu.Unlock()
	if l.err != nil {
		return nil // counted and cleaned up by launcherFailed
	}
	ready, err := awaitReady(l.sock, time.Until(deadline))
	switch {
	case ready && l.child != "" && e.cg.ChildOOMKills(c.id, l.child) > 0:
		// The kernel OOM-killed a process in its cgroup (made while the cell was at its
		// memory limit): a command must start where only its own processes can have
		// been killed (Tree.OOMKilled).
		e.discardLauncher(c, l)
		return nil
	case ready:
		e.mu.Lock()
		c.launcherFailures = 0
		e.mu.Unlock()
		return l
	case err == nil: // still setting up: back in its place, unless the cell is going
		e.mu.Lock()
		keep := c.launcher == nil && e.live(c.id) == c
		if keep {
			c.launcher = l
		}
		e.mu.Unlock()
		if !keep {
			e.discardLauncher(c, l)
		}
		return nil
	}
	e.launcherFailed(c, l)
	e.discardLauncher(c, l)
	return nil
}

// awaitReady waits up to d for a launcher's ready byte (0: only looks); an error if it
// exited instead.
func awaitReady(sock *os.File, d time.Duration) (bool, error) {
	fds := []unix.PollFd{{Fd: int32(sock.Fd()), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, max(int(d/time.Millisecond), 0))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, err
		}
		if n == 0 {
			return false, nil
		}
		break
	}
	b := make([]byte, 1)
	n, _, err := unix.Recvfrom(int(sock.Fd()), b, unix.MSG_DONTWAIT)
	switch {
	case err != nil:
		return false, err
	case n != 1 || b[0] != initproc.LaunchReady:
		return false, errors.New("launcher exited before it was ready")
	}
	return true, nil
}

// launcherFailed logs why a launcher could not be made or exited early, and counts it.
func (e *Engine) launcherFailed(c *cell, l *launcher) {
	msg := ""
	if l.err != nil {
		msg = l.err.Error()
	} else if l.report != nil {
		b, _ := io.ReadAll(io.LimitReader(l.report, 4096))
		msg = string(b)
	}
	e.mu.Lock()
	c.launcherFailures++
	n := c.launcherFailures
	e.mu.Unlock()
	level := slog.LevelDebug
	if n == maxLauncherFailures {
		level = slog.LevelWarn
	}
	e.log.Log(context.Background(), level, "launcher failed: commands of this cell start the plain way", "cell", c.id, "err", msg, "failures", n)
	if l.err != nil {
		e.discardLauncher(c, l)
	}
}

// discardLauncher ends a launcher that will not run a command, reaps it and removes its
// cgroup.
func (e *Engine) discardLauncher(c *cell, l *launcher) {
	if l.proc != nil {
		_ = l.proc.Kill()
		_, _ = l.proc.Wait()
	}
	for _, f := range []*os.File{l.sock, l.report} {
		if f != nil {
			f.Close()
		}
	}
	if l.child != "" {
		if err := e.dropChild(c.id, l.child); err != nil { // its OOM kills stay in the tally
			e.log.Warn("remove launcher cgroup", "cell", c.id, "cgroup", l.child, "err", err)
		}
	}
}

// cancelLauncher tells the cell's launcher, if it has one, that it is not needed: one
// waiting for quiet (awaitQuiet) ends at once instead of being forked and then discarded.
func (e *Engine) cancelLauncher(c *cell) {
	e.mu.Lock()
	l := c.launcher
	e.mu.Unlock()
	if l != nil {
		l.cancelOnce.Do(func() { close(l.cancel) })
	}
}

// dropLauncher discards the cell's launcher, if it has one (Remove, Close).
func (e *Engine) dropLauncher(c *cell) {
	e.mu.Lock()
	l := c.launcher
	c.launcher = nil
	e.mu.Unlock()
	if l != nil {
		l.cancelOnce.Do(func() { close(l.cancel) })
		<-l.made
		if l.err == nil {
			e.discardLauncher(c, l)
		}
	}
}

// send gives the launcher its command: kind, then the sealed command and its standard
// descriptors (nil ones /dev/null). The socket stays open until the launcher has exec'd
// (startLaunched): one forked for the command may still have to say it is ready.
func (l *launcher) send(cmd initproc.Launch, tty bool, stdio [3]*os.File) error {
	b, err := initproc.EncodeLaunch(cmd)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	config, err := sealedMemfd("sidecar-launch", b)
	if err != nil {
		return err
	}
	defer config.Close()
	fds := []int{int(config.Fd())}
	for _, f := range stdio {
		if f != nil {
			fds = append(fds, int(f.Fd()))
			continue
		}
		null, err := unix.Open(os.DevNull, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: os.DevNull, Err: err}
		}
		defer unix.Close(null)
		fds = append(fds, null)
	}
	kind := []byte{initproc.LaunchPipes}
	if tty {
		kind[0] = initproc.LaunchTTY
	}
	return unix.Sendmsg(int(l.sock.Fd()), kind, unix.UnixRights(fds...), nil, 0)
}

// LauncherState is what a cell's running launcher is doing, for tests and diagnostics.
type LauncherState struct {
	PID    int
	Cgroup string // its child cgroup
	Ready  bool   // it has said so and waits for a command
	Gone   bool   // it exited; the next command that looks discards it
	Zygote int    // the pid of the cell's zygote, which forked it; 0: none
}

// Launcher describes the cell's launcher; false when it has none running. Call it only
// while no command starts in the cell: a command may take the launcher meanwhile.
func (e *Engine) Launcher(id string) (LauncherState, bool) {
	e.mu.Lock()
	var l *launcher
	zygote := 0
	if c := e.cells[id]; c != nil {
		l = c.launcher
		if c.zygote != nil {
			zygote = c.zygote.proc.Pid
		}
	}
	e.mu.Unlock()
	if !l.started() {
		return LauncherState{}, false
	}
	fds := []unix.PollFd{{Fd: int32(l.sock.Fd()), Events: unix.POLLIN}}
	_, _ = unix.Poll(fds, 0)
	return LauncherState{PID: l.proc.Pid, Cgroup: l.child, Zygote: zygote,
		Ready: fds[0].Revents&unix.POLLIN != 0, Gone: fds[0].Revents&unix.POLLHUP != 0}, true
}
