package process

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Manager runs and tracks the processes of every lease.
type Manager struct {
	cfg    Config
	logger *slog.Logger
	audit  *auditor
	store  store

	output   *budget       // what Execs hold, daemon-wide
	stop     chan struct{} // closed by Shutdown
	watchers sync.WaitGroup

	mu     sync.Mutex
	closed bool
	leases map[string]*leaseProcs
}

// leaseProcs is what one lease runs.
type leaseProcs struct {
	procs map[string]*Process // by id, including those still starting
	execs map[*run]struct{}   // Execs in flight, killed by ReleaseLease
	slots int                 // Execs admitted and not yet replied, at most MaxExecs
}

func (m *Manager) leaseLocked(leaseID string) *leaseProcs {
	lp := m.leases[leaseID]
	if lp == nil {
		lp = &leaseProcs{procs: map[string]*Process{}, execs: map[*run]struct{}{}}
		m.leases[leaseID] = lp
	}
	return lp
}

// New makes a Manager and loads the process records in cfg.StateDir: a record that was
// running when the previous daemon stopped becomes "lost", with no exit code.
func New(cfg Config) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:    cfg,
		logger: cfg.Logger,
		audit:  newAuditor(cfg.Logger, cfg.Now),
		store:  store{dir: cfg.StateDir},
		output: newBudget(cfg.OutputBudgetBytes),
		stop:   make(chan struct{}),
		leases: map[string]*leaseProcs{},
	}
	recs, bad, err := m.store.load()
	if err != nil {
		return nil, fmt.Errorf("process: loading records: %w", err)
	}
	for _, b := range bad {
		m.logger.Warn("skipping unreadable process record", "record", b)
	}
	for _, rec := range recs {
		if rec.State == apitype.ProcessRunning {
			rec.State, rec.ExitCode, rec.Signal, rec.EndedAt = apitype.ProcessLost, nil, "", nil
			if err := m.store.save(rec); err != nil {
				m.logger.Warn("marking process lost", "lease", rec.Lease, "pid", rec.ID, "err", err)
			}
		}
		m.leaseLocked(rec.Lease).procs[rec.ID] = finishedProcess(rec, m.stop)
	}
	return m, nil
}

// finishedProcess rebuilds an ended (or lost) process from its record; it has no output.
func finishedProcess(rec record, stop <-chan struct{}) *Process {
	p := &Process{
		id: rec.ID, lease: rec.Lease, argv: rec.Argv, tty: rec.TTY, startedAt: rec.StartedAt,
		log: newOutLog(MinBufferBytes, stop), stop: stop,
		ready: make(chan struct{}), done: make(chan struct{}),
		state: rec.State, exit: rec.ExitCode, signal: rec.Signal, timedOut: rec.TimedOut,
		oomKilled: rec.OOMKilled, endedAt: rec.EndedAt,
	}
	p.log.close()
	close(p.ready)
	close(p.done)
	return p
}

// StartRequest asks for a background process.
type StartRequest struct {
	// ID is optional and client-chosen ([A-Za-z0-9._-]{1,64}); the same lease and ID
	// return the existing process. Empty: the daemon picks "p" + random.
	ID   string
	Spec Spec
	// Rows and Cols are the TTY's start size: 0 takes 24x80, else 1..1000 each.
	Rows, Cols uint16
	// Timeout kills the tree once passed; IdleTimeout once no output came for that long.
	// Zero: none.
	Timeout, IdleTimeout time.Duration
	// Stdin keeps an input open for WriteStdin (for a TTY too); otherwise stdin is empty.
	Stdin bool
	// KillLeftovers kills what the process leaves behind once it exits, as ExecRequest's.
	KillLeftovers bool
	// Lossless holds the output from its first byte for the first lossless Subscription
	// (SubscribeLossless), so a viewer attaching right after the start misses nothing:
	// until it comes, or LosslessAttachWait passes, the process blocks once its output
	// fills the replay buffer.
	Lossless bool
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// checkTimeouts bounds a request's timeouts to 0 (none) .. MaxTimeout. (The Spec, argv
// included, is the Execer's to check.)
func checkTimeouts(timeout, idle time.Duration) error {
	if timeout < 0 || idle < 0 || timeout > MaxTimeout || idle > MaxTimeout {
		return fmt.Errorf("%w: timeouts must be between 0 and %d seconds", ErrInvalid, int(MaxTimeout.Seconds()))
	}
	return nil
}

// Start starts a background process. With r.ID set, a second Start with the same lease
// and ID (even concurrent) returns the first one's process and created=false; if that
// first Start failed, its error. ErrLimit when the lease already runs MaxProcesses.
// ctx bounds only the wait for a concurrent Start of the same ID; the process itself
// lives until it exits, is killed, or its lease is released.
func (m *Manager) Start(ctx context.Context, leaseID string, r StartRequest) (p *Process, created bool, err error) {
	if r.ID != "" && !idPattern.MatchString(r.ID) {
		return nil, false, fmt.Errorf("%w: process id must match [A-Za-z0-9._-]{1,%d}", ErrInvalid, MaxIDLength)
	}
	if err := checkTimeouts(r.Timeout, r.IdleTimeout); err != nil {
		return nil, false, err
	}
	rows, cols := r.Rows, r.Cols
	if rows == 0 {
		rows = DefaultRows
	}
	if cols == 0 {
		cols = DefaultCols
	}
	if err := CheckSize(rows, cols); err != nil { // bounded even without a TTY
		return nil, false, err
	}

	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, false, ErrClosed
	}
	lp := m.leaseLocked(leaseID)
	if existing := lp.procs[r.ID]; r.ID != "" && existing != nil {
		m.mu.Unlock()
		select {
		case <-existing.ready:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		if existing.startErr != nil {
			return nil, false, existing.startErr
		}
		return existing, false, nil
	}
	if n := m.runningLocked(lp); n >= m.cfg.MaxProcesses {
		m.mu.Unlock()
		return nil, false, fmt.Errorf("%w: lease runs %d of %d", ErrLimit, n, m.cfg.MaxProcesses)
	}
	id := r.ID
	for id == "" || lp.procs[id] != nil {
		id = "p" + strings.ToLower(rand.Text()[:12])
	}
	p = &Process{
		id: id, lease: leaseID, argv: slices.Clone(r.Spec.Argv), tty: r.Spec.TTY,
		log: newOutLog(m.cfg.BufferBytes, m.stop), stop: m.stop,
		ready: make(chan struct{}), done: make(chan struct{}),
		state: apitype.ProcessRunning, rows: rows, cols: cols,
	}
	lp.procs[id] = p
	m.mu.Unlock()
	if r.Lossless {
		p.log.holdFromStart(LosslessAttachWait)
	}

	logger := m.logger.With("lease", leaseID, "pid", id)
	run, err := startRun(m.cfg.Execer, leaseID, runOptions{spec: r.Spec, rows: rows, cols: cols, stdinPipe: r.Stdin, killLeftovers: r.KillLeftovers},
		p.log, func() { m.finish(p, logger) }, logger)
	if err != nil {
		m.mu.Lock()
		if lp.procs[id] == p {
			delete(lp.procs, id)
		}
		m.mu.Unlock()
		p.startErr = err
		close(p.ready)
		m.audit.line(leaseID, "process failed to start", append(argvAttrs(r.Spec.Argv), "err", err.Error())...)
		return nil, false, err
	}
	p.run, p.startedAt = run, m.cfg.Now()
	// Saved before ready closes: finish and ReleaseLease wait for ready, so this write
	// can never land after the exit record or after the record's removal.
	if err := m.store.save(p.record()); err != nil {
		logger.Error("persisting process record; a restart will not report it lost", "err", err)
	}
	// Before ready closes, as finish waits for it: the start's line precedes the end's.
	m.audit.line(leaseID, "process started", append([]any{"pid", id}, append(argvAttrs(r.Spec.Argv), "tty", r.Spec.TTY)...)...)
	close(p.ready)
	if r.Timeout > 0 || r.IdleTimeout > 0 {
		m.mu.Lock() // Add under the lock Shutdown closes with, so never after its Wait
		if !m.closed {
			m.watchers.Add(1)
			go func() {
				defer m.watchers.Done()
				run.supervise(r.Timeout, r.IdleTimeout, nil, m.stop)
			}()
		}
		m.mu.Unlock()
	}
	return p, true, nil
}

// finish runs once a background process has ended: it fixes its status, ends its
// output, persists the record and forgets the oldest finished processes of the lease
// beyond MaxExited.
func (m *Manager) finish(p *Process, logger *slog.Logger) {
	<-p.ready // p.run is set
	r := p.run
	ended := m.cfg.Now()
	code := r.status.code
	// Before the end shows anywhere: whoever saw the process end finds its line written.
	m.audit.line(p.lease, "process ended", "pid", p.id, "exit_code", code, "signal", r.status.signal,
		"timed_out", r.timedOut.Load(), "duration_ms", ended.Sub(p.startedAt).Milliseconds())
	p.mu.Lock()
	p.state, p.exit, p.signal, p.endedAt = apitype.ProcessExited, &code, r.status.signal, &ended
	p.timedOut, p.oomKilled = r.timedOut.Load(), r.oom
	p.mu.Unlock()
	p.log.close()
	if err := m.store.save(p.record()); err != nil {
		logger.Error("persisting process exit", "err", err)
	}
	close(p.done)

	m.mu.Lock()
	lp := m.leases[p.lease]
	var evict []*Process
	if lp != nil && lp.procs[p.id] == p {
		evict = m.overflowLocked(lp)
		for _, e := range evict {
			delete(lp.procs, e.id)
		}
	}
	m.mu.Unlock()
	for _, e := range evict {
		if err := m.store.remove(e.lease, e.id); err != nil {
			logger.Warn("removing record of a forgotten process", "forgotten", e.id, "err", err)
		}
	}
}

// overflowLocked picks the oldest finished processes beyond MaxExited (lost ones first).
func (m *Manager) overflowLocked(lp *leaseProcs) []*Process {
	var ended []*Process
	for _, p := range lp.procs {
		if p.started() && !p.running() {
			ended = append(ended, p)
		}
	}
	if len(ended) <= m.cfg.MaxExited {
		return nil
	}
	endTime := func(p *Process) time.Time {
		if s := p.Status(); s.EndedAt != nil {
			return *s.EndedAt
		}
		return time.Time{}
	}
	slices.SortFunc(ended, func(a, b *Process) int { return endTime(a).Compare(endTime(b)) })
	return ended[:len(ended)-m.cfg.MaxExited]
}

func (m *Manager) runningLocked(lp *leaseProcs) int {
	n := 0
	for _, p := range lp.procs {
		if p.running() {
			n++
		}
	}
	return n
}

// Get returns a process of the lease; ErrNotFound if there is none by that id.
func (m *Manager) Get(leaseID, pid string) (*Process, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if lp := m.leases[leaseID]; lp != nil {
		if p := lp.procs[pid]; p != nil && p.started() {
			return p, nil
		}
	}
	return nil, fmt.Errorf("%w: %q", ErrNotFound, pid)
}

// List returns the lease's processes, oldest first.
func (m *Manager) List(leaseID string) []*Process {
	m.mu.Lock()
	var ps []*Process
	if lp := m.leases[leaseID]; lp != nil {
		for _, p := range lp.procs {
			if p.started() {
				ps = append(ps, p)
			}
		}
	}
	m.mu.Unlock()
	slices.SortFunc(ps, func(a, b *Process) int {
		if c := a.startedAt.Compare(b.startedAt); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	return ps
}

// Running counts the lease's running background processes (those starting included).
func (m *Manager) Running(leaseID string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if lp := m.leases[leaseID]; lp != nil {
		return m.runningLocked(lp)
	}
	return 0
}

// Signal sends a signal, by name ("TERM", "SIGTERM", "kill"; see ParseSignal), to the
// process group of a running process. ErrInvalid for an unknown name, ErrNotFound,
// ErrExited once it ended.
func (m *Manager) Signal(leaseID, pid, name string) error {
	sig, err := ParseSignal(name)
	if err != nil {
		return err
	}
	p, err := m.Get(leaseID, pid)
	if err != nil {
		return err
	}
	if !p.running() || p.run == nil {
		return fmt.Errorf("%w: %s", ErrExited, pid)
	}
	if err := p.run.tree.Signal(sig); err != nil {
		return fmt.Errorf("process: signal %s to %s: %w", SignalName(sig), pid, err)
	}
	return nil
}

// Kill kills the whole tree of a running process (Tree.Kill: descendants that left the
// process group too), e.g. when the websocket that started it closes. ErrNotFound,
// ErrExited once it ended.
func (m *Manager) Kill(leaseID, pid string) error {
	p, err := m.Get(leaseID, pid)
	if err != nil {
		return err
	}
	if !p.running() || p.run == nil {
		return fmt.Errorf("%w: %s", ErrExited, pid)
	}
	if err := p.run.tree.Kill(); err != nil {
		return fmt.Errorf("process: kill %s: %w", pid, err)
	}
	return nil
}

// ReleaseLease kills every process of the lease (background and Exec), waits for them
// to end, forgets them and removes their records. Starts racing with it are the lease
// layer's to prevent (a released lease takes no new work).
func (m *Manager) ReleaseLease(leaseID string) {
	m.mu.Lock()
	lp := m.leases[leaseID]
	delete(m.leases, leaseID)
	var execs []*run
	var procs []*Process
	if lp != nil {
		// Snapshots: an Exec ending now still deletes itself from lp.execs.
		execs = slices.Collect(maps.Keys(lp.execs))
		procs = slices.Collect(maps.Values(lp.procs))
	}
	m.mu.Unlock()
	for _, r := range execs {
		r.kill(false)
	}
	for _, p := range procs {
		<-p.ready // a Start in flight finishes first, so its process is killed too
		if p.startErr != nil {
			continue
		}
		if p.run != nil && p.running() {
			p.run.kill(false)
		}
	}
	for _, p := range procs {
		if p.startErr != nil {
			continue
		}
		<-p.done // its record is final before it is removed
		if err := m.store.remove(leaseID, p.id); err != nil {
			m.logger.Warn("removing process record", "lease", leaseID, "pid", p.id, "err", err)
		}
	}
	m.audit.forget(leaseID)
}

// Shutdown stops the Manager: no new processes, timeouts stop being watched, and
// subscriptions end with ErrClosed. Processes are not killed (the lease teardown does
// that) and their records stay, so a restarted daemon reports them lost. It waits for
// the watchers until ctx ends.
func (m *Manager) Shutdown(ctx context.Context) {
	m.mu.Lock()
	if !m.closed {
		m.closed = true
		close(m.stop)
	}
	m.mu.Unlock()
	stopped := make(chan struct{})
	go func() { m.watchers.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
	}
}
