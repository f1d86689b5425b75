package confine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

// Tree is everything one command may fork: its own child cgroup (or, without cgroups, its
// process group). Package process supervises it; fakes in its tests stand in for it.
type Tree interface {
	// Start starts the command and returns once it runs the target, or with a *SetupError
	// when the confinement could not be set up around it (the helper has then been waited for).
	Start() error
	// Kill sends SIGKILL to every process in the tree, including those that called
	// setsid or double-forked, and returns once the tree is empty (a bounded wait).
	Kill() error
	// Signal delivers sig to the command's process group.
	Signal(sig syscall.Signal) error
	// OOMKilled reports whether the kernel's OOM killer killed a process of the tree.
	OOMKilled() bool
	// Close kills what is left and releases the tree's resources. Call it after Wait.
	Close() error
}

// SetupError is a step of the confinement that failed before the target ran: the helper's
// cgroup join, a mount, the uid drop, Landlock, seccomp... Step names it ("join cgroup").
// An exec failure (exit 126 or 127) is not one: it is the target's status, as a shell's.
type SetupError struct {
	Step string
	Msg  string // the helper's report, host paths included: for logs
}

func (e *SetupError) Error() string { return "sandbox: setup failed at " + e.Step + ": " + e.Msg }

// tree is one command's process tree: its child cgroup, or its process group without
// cgroups.
type tree struct {
	e      *Engine
	id     string          // the cell's
	c      *cell           // nil without cgroups
	start  Start           // the plain start's, made only when no launcher takes the command
	launch initproc.Launch // the command
	tty    bool
	child  string // child cgroup name, once Start gave it one; "" without cgroups
	cmd    *exec.Cmd

	report *os.File // read end of the helper's report pipe

	started    bool          // Start ran the target (Close is called after Wait, on the same goroutine as Start or after it)
	killFailed atomic.Bool   // a Kill failed: the child may be left frozen, never to be reused
	ended      chan struct{} // closed by Close: the command is over
	closeOnce  sync.Once
	closeErr   error
}

// Start hands the command to the cell's launcher when one is ready (launcher.go), else
// starts a helper for it; then it reads the helper's report pipe, which closes empty when
// the target is exec'd: no round trip beyond the start itself.
func (t *tree) Start() (err error) {
	if t.cmd.Process != nil {
		return errors.New("sandbox: command already started")
	}
	if t.c != nil {
		t.e.noteCommand(t.c, t.ended)
		defer t.e.refillLauncher(t.c, t.ended) // the next command's
		defer func() {
			// Its child cgroup was removed under the engine: so may the cell's spares have
			// been, which would fail the next commands the same way.
			if se := (*SetupError)(nil); errors.As(err, &se) && se.Step == "join cgroup" {
				t.e.dropSpares(t.c)
			}
		}()
	}
	if files, ok := t.stdio(); ok && t.c != nil {
		l := t.e.takeLauncher(t.c)
		if l == nil {
			var err error
			if l, err = t.e.forkNow(t.c); err != nil {
				return err
			}
		}
		if l != nil {
			err := l.send(t.launch, t.tty || t.cmd.SysProcAttr.Setctty, files)
			if err == nil {
				return t.startLaunched(l)
			}
			// It died since it said it was ready: the plain start.
			t.e.log.Debug("launcher gone before its command", "cell", t.id, "err", err)
			t.e.discardLauncher(t.c, l)
		}
	}
	if err := t.startPlain(); err != nil {
		return err
	}
	if err := t.readReport(); err != nil {
		return err
	}
	if t.c != nil {
		t.e.mu.Lock()
		t.c.launcherFailures = min(t.c.launcherFailures, maxLauncherFailures-1) // the cell can fork: one more try
		t.e.mu.Unlock()
	}
	return nil
}

// startPlain starts a helper for the command, in a child cgroup of its own.
func (t *tree) startPlain() error {
	if t.c != nil {
		var err error
		if t.child, err = t.e.takeChild(t.id); err != nil {
			return fmt.Errorf("confine: cell %s: child cgroup: %w", t.id, err)
		}
	}
	parentFiles, report, err := t.e.prepareHelper(t.id, t.cmd, t.start, t.child, nil)
	if err != nil {
		return err // Close removes the child cgroup, never entered
	}
	t.report = report
	return t.e.startHelper(t.id, t.cmd, t.child, parentFiles)
}

// stdio is the command's standard descriptors as files (nil: /dev/null), which a launcher
// can be given; false if one is another reader or writer (exec.Cmd would copy it).
func (t *tree) stdio() ([3]*os.File, bool) {
	var files [3]*os.File
	for i, v := range []any{t.cmd.Stdin, t.cmd.Stdout, t.cmd.Stderr} {
		switch f := v.(type) {
		case nil:
		case *os.File:
			files[i] = f
		default:
			return files, false
		}
	}
	return files, true
}

// startLaunched makes launcher l, which has its command, the command's process.
func (t *tree) startLaunched(l *launcher) error {
	t.child, t.report = l.child, l.report
	t.cmd.Process = l.proc // exec.Cmd.Wait waits for it as for one it started
	defer l.sock.Close()
	return t.readReport()
}

// readReport reads the helper's report pipe to its end: empty when the target was exec'd.
func (t *tree) readReport() error {
	msg, err := io.ReadAll(io.LimitReader(t.report, 4096))
	if err != nil {
		return err
	}
	if len(msg) == 0 {
		t.started = true // the target runs
		return nil
	}
	code, rest, _ := strings.Cut(string(msg), " ")
	if code != strconv.Itoa(initproc.ExitSetup) {
		t.started = true // the helper ran its exec: 126, 127, the exit status says it
		return nil
	}
	t.cmd.Wait()
	return parseSetupError(rest)
}

// parseSetupError reads "setup: join cgroup: open …: no such file…" or "config: bad
// config…" from a helper's report.
func parseSetupError(rest string) *SetupError {
	stage, detail, _ := strings.Cut(rest, ": ")
	step, _, _ := strings.Cut(detail, ": ")
	if stage != "setup" || step == "" {
		step = stage
	}
	return &SetupError{Step: step, Msg: rest}
}

// Kill SIGKILLs the whole tree, setsid'd and double-forked descendants included, and
// returns once its cgroup is empty (bounded by KillDeadline). Without cgroups it kills the
// process group, which a setsid'd descendant has left.
func (t *tree) Kill() error {
	if t.child == "" {
		return t.Signal(syscall.SIGKILL)
	}
	if p := t.cmd.Process; p != nil {
		// On v1 the helper may not have joined its cgroup yet, and has no children until
		// it has. os.Process signals through a pidfd: never a recycled pid.
		p.Kill()
	}
	ctx, cancel := context.WithTimeout(context.Background(), KillDeadline)
	defer cancel()
	err := t.e.cg.KillChild(ctx, t.id, t.child)
	if err != nil {
		t.killFailed.Store(true)
	}
	return err
}

// Signal delivers sig to the command's process group (the leader's pid: Setsid). Once the
// leader has been waited for, its pid may be reused, so the group is signalled only while
// the leader's pidfd says it has not been reaped.
func (t *tree) Signal(sig syscall.Signal) error {
	p := t.cmd.Process
	if p == nil {
		return errors.New("sandbox: command not started")
	}
	if err := p.Signal(syscall.Signal(0)); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return err
	}
	err := syscall.Kill(-p.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// OOMKilled reports whether the kernel OOM-killed a process of this command: the child
// cgroup's own oom_kill count, which only this command's processes can raise.
func (t *tree) OOMKilled() bool {
	return t.child != "" && t.e.cg.ChildOOMKills(t.id, t.child) > 0
}

// Close releases the tree. Processes the command left behind in its child cgroup stay
// there as the cell's leftovers (leftovers.go) until they exit, are signalled, or the
// cell is removed; an emptied child cgroup goes back to the cell for its next tree, or is
// removed in the background (children.go). Without cgroups it kills the process group, as
// nothing could find a leftover again. Kill first for a command whose leftovers must not
// stay.
func (t *tree) Close() error {
	t.closeOnce.Do(func() {
		defer close(t.ended)
		if t.report != nil {
			t.report.Close()
		}
		if t.cmd.Process == nil { // never started
			if t.child != "" {
				t.closeErr = t.e.cg.RemoveChild(t.id, t.child)
			}
			return
		}
		if t.child == "" {
			t.closeErr = t.Kill()
			return
		}
		defer t.e.PruneLeftovers(t.id) // the cell's earlier ones that emptied meanwhile
		if t.started && t.e.keepLeftovers(t.id, t.child) {
			return
		}
		// Never started, or empty: nothing will be left. Kill is a
		// no-op on an empty child, and takes a helper that never joined it.
		if err := t.Kill(); err != nil {
			t.closeErr = err
			return
		}
		// A child is reused only after its tree ran and every kill of it succeeded: a
		// set-up that failed may have failed for want of the child (removed under the
		// engine), and a failed kill may have left a v1 child frozen.
		if !t.started || t.killFailed.Load() {
			t.closeErr = t.e.dropChild(t.id, t.child)
			return
		}
		t.closeErr = t.e.recycleChild(t.id, t.child)
	})
	return t.closeErr
}

// Cgroup is the tree's child cgroup in its cell, "" without cgroups (tests and
// diagnostics).
func (t *tree) Cgroup() string { return t.child }
