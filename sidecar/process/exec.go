package process

import (
	"bytes"
	"context"
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
}

// ExecResult is the wire result of a finished command.
type ExecResult = apitype.ExecResult

// Exec runs a command to completion and returns its exit status and output (each
// stream capped at MaxOutputBytes; beyond it output is drained, dropped and flagged).
// A start failure is an error wrapping ErrStart. When ctx ends the tree is killed and
// the result so far is returned with ctx's error. A TTY Spec runs on a PTY of 24x80
// whose output is all Stdout; its input ends with the terminal's EOF character after
// r.Stdin (at once without it), see Process.CloseStdin.
func (m *Manager) Exec(ctx context.Context, leaseID string, r ExecRequest) (ExecResult, error) {
	if err := checkSpec(r.Spec); err != nil {
		return ExecResult{}, err
	}
	if err := checkTimeouts(r.Timeout, r.IdleTimeout); err != nil {
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
	m.mu.Unlock()

	stdin := r.Stdin
	if stdin == nil && r.Spec.TTY {
		// A terminal cannot be /dev/null: empty input is an immediate end of file.
		stdin = strings.NewReader("")
	}
	out := &capture{limit: m.cfg.MaxOutputBytes}
	began := m.cfg.Now()
	run, err := startRun(m.cfg.Execer, leaseID, runOptions{
		spec: r.Spec, rows: DefaultRows, cols: DefaultCols, stdinFrom: stdin,
	}, out, nil, m.logger.With("lease", leaseID))
	if err != nil {
		return ExecResult{}, err
	}
	m.mu.Lock()
	lp := m.leaseLocked(leaseID)
	lp.execs[run] = struct{}{}
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(lp.execs, run)
		m.mu.Unlock()
	}()

	run.supervise(r.Timeout, r.IdleTimeout, ctx.Done(), nil)
	<-run.done
	res := ExecResult{
		ExitCode:        run.status.code,
		Signal:          run.status.signal,
		Stdout:          out.streams[0].String(),
		Stderr:          out.streams[1].String(),
		StdoutTruncated: out.truncated[0],
		StderrTruncated: out.truncated[1],
		TimedOut:        run.timedOut.Load(),
		OOMKilled:       run.oom,
		DurationMS:      m.cfg.Now().Sub(began).Milliseconds(),
	}
	if run.canceled.Load() {
		return res, ctx.Err()
	}
	return res, nil
}

// capture keeps the first limit bytes of stdout and of stderr. Each stream has its own
// pump goroutine and its own slot, so no lock is needed; the result is read after the
// pumps ended.
type capture struct {
	limit     int64
	streams   [2]bytes.Buffer
	truncated [2]bool
}

func (c *capture) write(channel byte, p []byte) bool {
	i := int(channel - apitype.ChannelStdout)
	room := c.limit - int64(c.streams[i].Len())
	if int64(len(p)) > room {
		p = p[:max(room, 0)]
		c.truncated[i] = true
	}
	c.streams[i].Write(p)
	return false
}
