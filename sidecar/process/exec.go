package process

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
	"unsafe"

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
// output is drained, dropped and flagged truncated). A lease runs at most MaxExecs at
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
	out := &capture{limit: m.cfg.MaxOutputBytes, budget: m.output}
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
		return ExecResult{}, err
	}
	m.mu.Lock()
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
		Stdout:          out.string(0),
		Stderr:          out.string(1),
		StdoutTruncated: out.truncated[0],
		StderrTruncated: out.truncated[1],
		TimedOut:        run.timedOut.Load(),
		OOMKilled:       run.oom,
		DurationMS:      m.cfg.Now().Sub(began).Milliseconds(),
	}
	if run.canceled.Load() {
		return res, ctx.Err()
	}
	if r.Reply != nil {
		return res, r.Reply(res)
	}
	return res, nil
}

// minCapture is the first allocation of a capture stream, outside the budget: most
// outputs are small, and these always arrive whole however much big ones hold.
const minCapture = 4 << 10

// capture keeps the first limit bytes of stdout and of stderr, in buffers whose capacity
// beyond minCapture is charged to the daemon's output budget. Each stream has its own
// pump goroutine and its own slot, and the budget is atomic, so no lock is needed; the
// result is read after the pumps ended.
type capture struct {
	limit     int64
	budget    *budget
	streams   [2][]byte
	charged   [2]int64 // capacity taken from the budget, per stream
	truncated [2]bool
}

func (c *capture) write(channel byte, p []byte) bool {
	i := int(channel - apitype.ChannelStdout)
	buf := c.streams[i]
	if room := c.limit - int64(len(buf)); int64(len(p)) > room {
		p = p[:max(room, 0)]
		c.truncated[i] = true
	}
	if cap(buf) == 0 && len(p) > 0 {
		buf = make([]byte, 0, min(minCapture, c.limit))
	}
	if need := len(buf) + len(p); need > cap(buf) {
		// Grow by doubling (bounded by the limit) when the budget allows, else by what
		// this write needs, else by what is left of the budget.
		want := min(max(2*int64(cap(buf)), int64(need), minCapture), c.limit)
		got := c.budget.take(want - int64(cap(buf)))
		if got < want-int64(cap(buf)) {
			c.budget.give(got)
			got = c.budget.take(int64(need - cap(buf)))
		}
		if int64(len(buf))+int64(len(p)) > int64(cap(buf))+got {
			p = p[:int64(cap(buf))+got-int64(len(buf))]
			c.truncated[i] = true
		}
		if got > 0 {
			grown := make([]byte, len(buf), int64(cap(buf))+got)
			copy(grown, buf)
			buf = grown
			c.charged[i] += got
		}
	}
	c.streams[i] = append(buf, p...)
	return false
}

// string returns stream i without a copy: the bytes never change once the pumps ended.
func (c *capture) string(i int) string {
	b := c.streams[i]
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// release gives the buffers' capacity back to the budget.
func (c *capture) release() {
	for i := range c.charged {
		c.budget.give(c.charged[i])
		c.charged[i] = 0
	}
}

// Capture is an Exec's output capture for a caller that collects a command's output
// itself (a shell session's command, framed out of its shell's longer stream): the same
// MaxOutputBytes per stream, the same first 4 KiB outside the budget, and beyond them the
// same daemon-wide OutputBudgetBytes that every Exec shares, so that no output a request
// holds escapes it. What neither grants is dropped and flagged truncated; Write never
// blocks. Not safe for concurrent use.
type Capture struct{ c capture }

// NewCapture returns an empty Capture on the Manager's limit and budget. The caller must
// Release it, once the output's reply is written.
func (m *Manager) NewCapture() *Capture {
	return &Capture{c: capture{limit: m.cfg.MaxOutputBytes, budget: m.output}}
}

// Write keeps what the limit and the budget allow of p (channel is apitype.ChannelStdout
// or ChannelStderr) and flags the stream truncated when that is not all of it. p is not
// kept.
func (c *Capture) Write(channel byte, p []byte) { c.c.write(channel, p) }

// Truncate flags a stream truncated: output was lost before it reached Write.
func (c *Capture) Truncate(channel byte) { c.c.truncated[channel-apitype.ChannelStdout] = true }

// Output returns what a stream kept and whether it was truncated. The string shares memory
// with the Capture (no copy outside the budget): no Write may follow, and it is counted
// only until Release.
func (c *Capture) Output(channel byte) (string, bool) {
	i := int(channel - apitype.ChannelStdout)
	return c.c.string(i), c.c.truncated[i]
}

// Release gives the Capture's share of the budget back. No Write may follow.
func (c *Capture) Release() { c.c.release() }
