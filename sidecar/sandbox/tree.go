package sandbox

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
	"syscall"
	"time"

	"github.com/sidecar-sandbox/sidecar/sidecar/sandbox/initproc"
)

// SetupError is a failure the helper reported before it could exec the target (the
// executable vanished, a mount or Landlock failed). The helper then exits with 125-127.
type SetupError struct {
	Code int // the helper's exit code
	Msg  string
}

func (e *SetupError) Error() string { return "sandbox: start: " + e.Msg }

// tree is one command's process tree: its child cgroup, or its process group without
// cgroups.
type tree struct {
	s       *Sandbox
	leaseID string
	child   string // child cgroup name, "" without cgroups
	cmd     *exec.Cmd

	report      *os.File   // read end of the helper's report pipe
	parentFiles []*os.File // the daemon's copies of what the helper inherits

	once      sync.Once
	setupErr  error
	closeOnce sync.Once
	closeErr  error
}

// Started waits until the helper has exec'd the target and returns the helper's setup
// error, if any (a *SetupError; "not found" also wraps exec.ErrNotFound). Call it after
// cmd.Start; it also drops the daemon's copies of the helper's descriptors.
func (t *tree) Started(ctx context.Context) error {
	if t.cmd.Process == nil {
		return errors.New("sandbox: command not started")
	}
	t.once.Do(func() {
		t.closeParentFiles()
		done := make(chan struct{})
		go func() {
			select {
			case <-ctx.Done():
				t.report.SetReadDeadline(time.Now())
			case <-done:
			}
		}()
		msg, err := io.ReadAll(io.LimitReader(t.report, 4096))
		close(done)
		switch {
		case err != nil:
			t.setupErr = fmt.Errorf("sandbox: waiting for start: %w", err)
		case len(msg) > 0:
			t.setupErr = parseReport(string(msg))
		}
	})
	return t.setupErr
}

// Unwrap makes a missing executable match exec.ErrNotFound.
func (e *SetupError) Unwrap() error {
	if e.Code == initproc.ExitNotFound {
		return exec.ErrNotFound
	}
	return nil
}

func (t *tree) closeParentFiles() {
	for _, f := range t.parentFiles {
		f.Close()
	}
	t.parentFiles = nil
}

func parseReport(msg string) *SetupError {
	code, rest, _ := strings.Cut(msg, " ")
	n, err := strconv.Atoi(code)
	if err != nil {
		return &SetupError{Code: initproc.ExitSetup, Msg: msg}
	}
	return &SetupError{Code: n, Msg: rest}
}

// Kill SIGKILLs the whole tree, setsid'd and double-forked descendants included, and
// returns once its cgroup is empty (bounded by killDeadline). Without cgroups it kills the
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
	ctx, cancel := context.WithTimeout(context.Background(), killDeadline)
	defer cancel()
	return t.s.cg.killChild(ctx, t.leaseID, t.child)
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
	return t.child != "" && t.s.cg.childOOMKills(t.leaseID, t.child) > 0
}

// Close kills what is left of the tree and removes its child cgroup (in the background:
// nothing can enter an emptied cgroup).
func (t *tree) Close() error {
	t.closeOnce.Do(func() {
		t.closeParentFiles()
		if t.report != nil {
			t.report.Close()
		}
		if t.cmd == nil { // Command failed half-way
			if t.child != "" {
				t.closeErr = t.s.cg.removeChild(t.leaseID, t.child)
			}
			return
		}
		if err := t.Kill(); err != nil {
			t.closeErr = err
			return
		}
		if t.child == "" {
			return
		}
		oom := t.s.cg.childOOMKills(t.leaseID, t.child)
		t.s.mu.Lock()
		if le := t.s.leases[t.leaseID]; le != nil && t.s.cg.version() == "v1" {
			le.oomKills += oom
			if le.removing == nil {
				le.removing = map[string]bool{}
			}
			le.removing[t.child] = true // Usage must not count it twice meanwhile
		}
		t.s.mu.Unlock()
		t.closeErr = t.s.dropChild(t.leaseID, t.child)
	})
	return t.closeErr
}
