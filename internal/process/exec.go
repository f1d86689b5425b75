package process

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// ExecRequest asks for a command run to completion.
type ExecRequest struct {
	Spec Spec
	// Stdin is copied to the command's stdin, which is then closed; nil: empty stdin
	// (never the daemon's). Exec does not wait for a Read on it that blocks: closing it
	// is the caller's job.
	Stdin io.Reader
	// Timeout kills the whole tree once passed; IdleTimeout once no output came for that
	// long. Either sets TimedOut; the output so far is kept. Zero: none.
	Timeout, IdleTimeout time.Duration
	// KillLeftovers kills what the command leaves behind (`server &`) once its main
	// process exits; otherwise that stays in the lease until the lease ends (see the
	// package doc).
	KillLeftovers bool
	// OutputHeadBytes is how much of each stream's MaxOutputBytes comes from its start
	// when the stream outgrows them; the rest is its end. nil: half. Beyond
	// 0..MaxOutputBytes: ErrInvalid.
	OutputHeadBytes *int64
	// Reply, when set, gets the result of a run that ended without error, before Exec
	// returns: the exec's slot (MaxExecs) and its output's share of OutputBudgetBytes are
	// held until Reply returns, so a caller that writes its reply there (to a client that
	// may read slowly) stays within both. Its error is Exec's.
	Reply func(ExecResult) error
}

// ExecResult is the wire result of a finished command.
type ExecResult = apitype.ExecResult

// Exec runs a command to completion and returns its exit status and output (each
// stream capped at MaxOutputBytes, all Execs together at OutputBudgetBytes; beyond either,
// output is drained and the middle of the stream dropped: its head and its end are kept,
// split as r.OutputHeadBytes says, and the result counts the bytes dropped). A lease runs at most MaxExecs at
// once: beyond, ErrExecLimit. A start failure is an error wrapping ErrStart. When ctx
// ends the tree is killed and the result so far is returned with ctx's error. A TTY Spec
// runs on a PTY of 24x80 whose output is all Stdout; its input ends with the terminal's
// EOF character after r.Stdin (at once without it), see Process.CloseStdin.
//
// The result's Stdout and Stderr share memory with the capture: the budget is given back
// when Exec returns, so a caller that keeps the result long should write it in r.Reply.
func (m *Manager) Exec(ctx context.Context, leaseID string, r ExecRequest) (ExecResult, error) {
	if err := checkTimeouts(r.Timeout, r.IdleTimeout); err != nil {
		return ExecResult{}, err
	}
	head, err := headBytes(r.OutputHeadBytes, m.cfg.MaxOutputBytes)
	if err != nil {
		return ExecResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return ExecResult{}, err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ExecResult{}, ErrClosed
	}
	lp := m.leaseLocked(leaseID)
	if lp.slots >= m.cfg.MaxExecs {
		m.mu.Unlock()
		return ExecResult{}, fmt.Errorf("%w: %d at once per lease", ErrExecLimit, m.cfg.MaxExecs)
	}
	lp.slots++
	m.mu.Unlock()
	out := newCapture(m.cfg.MaxOutputBytes, head, m.output)
	defer func() {
		out.release()
		m.mu.Lock()
		lp.slots--
		m.mu.Unlock()
	}()

	stdin := r.Stdin
	if stdin == nil && r.Spec.TTY {
		// A terminal cannot be /dev/null: empty input is an immediate end of file.
		stdin = strings.NewReader("")
	}
	began := m.cfg.Now()
	run, err := startRun(m.cfg.Execer, leaseID, runOptions{
		spec: r.Spec, rows: DefaultRows, cols: DefaultCols, stdinFrom: stdin, killLeftovers: r.KillLeftovers,
	}, out, nil, m.logger.With("lease", leaseID))
	if err != nil {
		m.audit.line(leaseID, "exec failed to start", append(argvAttrs(r.Spec.Argv), "err", err.Error())...)
		return ExecResult{}, err
	}
	m.mu.Lock()
	lp.execs[run] = struct{}{}
	// A ReleaseLease between the start and this line did not see the run: it is this
	// Exec's to kill, as ReleaseLease would have.
	released := m.leases[leaseID] != lp
	m.mu.Unlock()
	if released {
		run.kill(false)
	}
	defer func() {
		m.mu.Lock()
		delete(lp.execs, run)
		m.mu.Unlock()
	}()

	run.supervise(r.Timeout, r.IdleTimeout, ctx.Done(), nil)
	<-run.done
	stdout, stderr := out.result(0), out.result(1)
	res := ExecResult{
		ExitCode:        run.status.code,
		Signal:          run.status.signal,
		Stdout:          stdout.out,
		Stderr:          stderr.out,
		StdoutTruncated: stdout.truncated,
		StderrTruncated: stderr.truncated,
		StdoutDropped:   stdout.dropped,
		StderrDropped:   stderr.dropped,
		StdoutDroppedAt: stdout.at,
		StderrDroppedAt: stderr.at,
		TimedOut:        run.timedOut.Load(),
		OOMKilled:       run.oom,
		DurationMS:      m.cfg.Now().Sub(began).Milliseconds(),
	}
	m.audit.line(leaseID, "exec", append(argvAttrs(r.Spec.Argv), "exit_code", res.ExitCode, "signal", res.Signal,
		"timed_out", res.TimedOut, "duration_ms", res.DurationMS)...)
	if run.canceled.Load() {
		return res, ctx.Err()
	}
	if r.Reply != nil {
		return res, r.Reply(res)
	}
	return res, nil
}
