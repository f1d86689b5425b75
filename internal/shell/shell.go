package shell

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/process"
)

// Sentinel errors; the HTTP layer maps them to stable codes (in parentheses).
var (
	// ErrNotFound: no such session in this lease, or its shell has ended (shell_not_found).
	ErrNotFound = errors.New("shell: session not found")
	// ErrBusy: the session is running a command (shell_busy).
	ErrBusy = errors.New("shell: session busy")
	// ErrLimit: the lease already has MaxSessions sessions (lease_limit).
	ErrLimit = errors.New("shell: too many sessions")
	// ErrInvalid: bad input: command, shell path, timeout (invalid_request).
	ErrInvalid = errors.New("shell: invalid request")
	// ErrNotReady: the shell ended or did not answer before it was ready (invalid_request:
	// the shell asked for is not a POSIX shell, or the lease cannot run one).
	ErrNotReady = errors.New("shell: shell did not start")
)

// Defaults and bounds.
const (
	DefaultMaxSessions     = 8
	DefaultMaxCommandBytes = 64 << 10
	DefaultStartTimeout    = 10 * time.Second
	DefaultInterruptGrace  = 2 * time.Second
	// MaxShellPath bounds the shell a session may ask for.
	MaxShellPath = 256
)

// Processes is what a session needs of package process (its Manager).
type Processes interface {
	Start(ctx context.Context, leaseID string, r process.StartRequest) (*process.Process, bool, error)
	Signal(leaseID, pid, name string) error
	Kill(leaseID, pid string) error
	// NewCapture holds a command's output within the limit and the daemon-wide output
	// budget that run-to-completion execs share, keeping head bytes of a long stream's
	// start (nil: half) and the rest from its end.
	NewCapture(head *int64) (*process.Capture, error)
}

// Config configures a Manager; zero values take the defaults.
type Config struct {
	Processes Processes // required
	// MaxSessions bounds the open sessions of one lease. Default 8.
	MaxSessions int
	// MaxCommandBytes bounds one command's text. Default 64 KiB.
	MaxCommandBytes int
	// StartTimeout bounds the wait for a new shell to answer. Default 10s.
	StartTimeout time.Duration
	// InterruptGrace is how long an interrupted command has before its processes are
	// killed, and they before the shell is. Default 2s.
	InterruptGrace time.Duration
	Now            func() time.Time
	Logger         *slog.Logger
}

// Manager holds the sessions of every lease.
type Manager struct {
	cfg Config

	mu     sync.Mutex
	leases map[string]map[string]*Session // lease → id → session, those starting included
}

// New makes a Manager.
func New(cfg Config) (*Manager, error) {
	if cfg.Processes == nil {
		return nil, fmt.Errorf("%w: Config.Processes is required", ErrInvalid)
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	if cfg.MaxCommandBytes <= 0 {
		cfg.MaxCommandBytes = DefaultMaxCommandBytes
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.InterruptGrace <= 0 {
		cfg.InterruptGrace = DefaultInterruptGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, leases: map[string]map[string]*Session{}}, nil
}

// Limits reports the bounds in effect (for GET /v1/info and documentation).
func (m *Manager) Limits() (sessions, commandBytes int) {
	return m.cfg.MaxSessions, m.cfg.MaxCommandBytes
}

// CreateRequest asks for a session.
type CreateRequest struct {
	// Shell is an absolute path to a POSIX shell inside the lease; "" takes bash when the
	// lease's PATH has it, else /bin/sh.
	Shell string
	Env   map[string]string
	Cwd   string // relative to the workdir, as an exec's
}

// autoShell runs bash if the lease has it, else sh; both read commands from stdin.
var autoShell = []string{"/bin/sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash; exec /bin/sh"}

// Create starts a session's shell and waits until it is ready. ctx bounds only that wait;
// the session belongs to the lease.
func (m *Manager) Create(ctx context.Context, leaseID string, r CreateRequest) (*Session, error) {
	argv := autoShell
	if r.Shell != "" {
		if !strings.HasPrefix(r.Shell, "/") || len(r.Shell) > MaxShellPath || strings.ContainsRune(r.Shell, 0) {
			return nil, fmt.Errorf("%w: shell must be an absolute path of at most %d bytes", ErrInvalid, MaxShellPath)
		}
		argv = []string{r.Shell}
	}
	id := "sh" + strings.ToLower(rand.Text()[:12])
	s := &Session{
		m: m, id: id, lease: leaseID, gone: make(chan struct{}),
		logger: m.cfg.Logger.With("lease", leaseID, "shell", id),
	}
	m.mu.Lock()
	ls := m.leases[leaseID]
	if len(ls) >= m.cfg.MaxSessions {
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: lease has %d of %d sessions", ErrLimit, len(ls), m.cfg.MaxSessions)
	}
	if ls == nil {
		ls = map[string]*Session{}
		m.leases[leaseID] = ls
	}
	ls[id] = s // holds the slot while starting; Get and List skip it until ready
	m.mu.Unlock()

	if err := s.start(ctx, argv, r); err != nil {
		m.forget(s)
		return nil, err
	}
	return s, nil
}

// Get returns a ready session of the lease.
func (m *Manager) Get(leaseID, id string) (*Session, error) {
	m.mu.Lock()
	s := m.leases[leaseID][id]
	m.mu.Unlock()
	if s == nil || !s.isReady() {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	return s, nil
}

// List returns the lease's ready sessions, oldest first.
func (m *Manager) List(leaseID string) []*Session {
	m.mu.Lock()
	var out []*Session
	for _, s := range m.leases[leaseID] {
		if s.isReady() {
			out = append(out, s)
		}
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b *Session) int {
		if c := a.started.Compare(b.started); c != 0 {
			return c
		}
		return strings.Compare(a.id, b.id)
	})
	return out
}

// Close kills a session's shell (and the command it runs, whose Run then reports Ended)
// and waits until the session is gone.
func (m *Manager) Close(leaseID, id string) error {
	s, err := m.Get(leaseID, id)
	if err != nil {
		return err
	}
	s.kill()
	return nil
}

// ReleaseLease closes every session of the lease. The process layer's ReleaseLease kills
// the shells too; this makes the sessions disappear before it.
func (m *Manager) ReleaseLease(leaseID string) {
	m.mu.Lock()
	ls := m.leases[leaseID]
	delete(m.leases, leaseID)
	m.mu.Unlock()
	for _, s := range ls {
		if s.isReady() {
			s.kill()
		}
	}
}

func (m *Manager) forget(s *Session) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ls := m.leases[s.lease]; ls[s.id] == s {
		delete(ls, s.id)
		if len(ls) == 0 {
			delete(m.leases, s.lease)
		}
	}
}

// Session is one persistent shell.
type Session struct {
	m       *Manager
	id      string
	lease   string
	logger  *slog.Logger
	proc    *process.Process
	kind    string // "bash" or "sh"
	pid     int    // the shell's pid (no pid namespace: the daemon's view too)
	started time.Time
	gone    chan struct{} // closed once the shell's output ended: the session is over

	mu       sync.Mutex
	ready    bool
	ended    bool
	cur      *command // the command running, or the handshake
	busy     bool
	cwd      string
	lastExit *int
	commands int
	lost     int64 // output bytes the replay buffer dropped before the pump read them
}

func (s *Session) isReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready && !s.ended
}

func (s *Session) start(ctx context.Context, argv []string, r CreateRequest) error {
	p, _, err := s.m.cfg.Processes.Start(context.WithoutCancel(ctx), s.lease, process.StartRequest{
		ID:    s.id,
		Spec:  process.Spec{Argv: argv, Env: r.Env, Dir: r.Cwd},
		Stdin: true,
	})
	if err != nil {
		return err
	}
	s.proc, s.started = p, s.m.cfg.Now()
	sub, err := p.Subscribe(0)
	if err != nil {
		s.m.cfg.Processes.Kill(s.lease, s.id)
		return err
	}
	hello := newCommand(newNonce(), nil) // what a shell prints before it is ready is dropped
	s.cur = hello
	go s.pump(sub)
	if _, err := p.WriteStdin([]byte(initScript(hello.nonce))); err != nil {
		s.kill()
		return fmt.Errorf("%w: %v", ErrNotReady, err)
	}
	timer := time.NewTimer(s.m.cfg.StartTimeout)
	defer timer.Stop()
	select {
	case <-hello.done:
	case <-timer.C:
	case <-ctx.Done():
	}
	s.mu.Lock()
	pidText, kind, ok := hello.trailer()
	pid, perr := strconv.Atoi(pidText)
	if s.ended || !ok || perr != nil || pid <= 0 {
		s.mu.Unlock()
		s.kill()
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("%w: it ended or did not answer within %s (is it a POSIX shell?)", ErrNotReady, s.m.cfg.StartTimeout)
	}
	s.pid, s.kind = pid, "sh"
	if kind == "bash" {
		s.kind = "bash"
	}
	s.cur, s.ready = nil, true
	s.mu.Unlock()
	s.logger.Info("shell session started", "kind", s.kind)
	return nil
}

// pump reads the shell's output for the whole session and hands it to the command
// running; once the shell's output ends, the session is over.
func (s *Session) pump(sub *process.Subscription) {
	defer sub.Close()
	for {
		c, err := sub.Next(context.Background()) // ends with the process or the Manager
		if err != nil {
			break
		}
		s.mu.Lock()
		if s.cur != nil {
			if lost := sub.Lost(); lost > s.lost && s.cur.out != nil {
				s.cur.out.Truncate(apitype.ChannelStdout)
				s.cur.out.Truncate(apitype.ChannelStderr)
			}
			s.cur.feed(c.Channel, c.Data)
		}
		s.lost = sub.Lost()
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.ended = true
	if s.cur != nil {
		s.cur.end()
	}
	s.mu.Unlock()
	s.m.forget(s)
	close(s.gone)
	s.logger.Info("shell session ended")
}

// kill ends the shell and waits for the session to be over (bounded: the process layer
// kills the whole tree, and a shutdown closes every subscription).
func (s *Session) kill() {
	if err := s.m.cfg.Processes.Kill(s.lease, s.id); err != nil && !errors.Is(err, process.ErrExited) {
		s.logger.Warn("killing shell", "err", err)
	}
	<-s.gone
}

// Status is the session as the API shows it.
func (s *Session) Status() apitype.Shell {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := apitype.Shell{
		ID: s.id, Shell: s.kind, Cwd: s.cwd, Busy: s.busy, StartedAt: s.started,
		Commands: s.commands,
	}
	if s.lastExit != nil {
		code := *s.lastExit
		st.LastExitCode = &code
	}
	return st
}

// ID is the session's id, which is also its shell's process id.
func (s *Session) ID() string { return s.id }

// RunRequest is one command for a session.
type RunRequest struct {
	Command string
	// Timeout interrupts the command once passed (see the package doc). Zero: none; at
	// most process.MaxTimeout.
	Timeout time.Duration
	// OutputHeadBytes: as process.ExecRequest's.
	OutputHeadBytes *int64
	// Reply, when set, gets the result of a run that ended without error, before Run
	// returns: the output's share of the daemon's output budget is held until Reply
	// returns (the session is free again already), so a caller that writes its reply
	// there stays within the budget. Its error is Run's.
	Reply func(Result) error
}

// Result is what a command did.
type Result = apitype.ShellResult

// Run runs one command in the session and returns its result, each stream capped at the
// process layer's MaxOutputBytes and all output the daemon holds at its OutputBudgetBytes
// (see process.Capture). ErrBusy while another runs; ErrNotFound once the session is over.
// When ctx ends the command is interrupted as on a timeout and ctx's error is returned.
//
// The result's Stdout and Stderr share memory with the capture, whose budget is given
// back when Run returns: a caller that keeps the result long should write it in r.Reply.
func (s *Session) Run(ctx context.Context, r RunRequest) (Result, error) {
	if err := s.checkRun(r); err != nil {
		return Result{}, err
	}
	out, err := s.m.cfg.Processes.NewCapture(r.OutputHeadBytes)
	if err != nil {
		return Result{}, err
	}
	defer out.Release()
	res, err := s.run(ctx, r, newCommand(newNonce(), out))
	if err == nil && r.Reply != nil {
		return res, r.Reply(res)
	}
	return res, err
}

// run is Run until the session is free again; the pump no longer writes to c after it.
func (s *Session) run(ctx context.Context, r RunRequest, c *command) (Result, error) {
	s.mu.Lock()
	switch {
	case s.ended || !s.ready:
		s.mu.Unlock()
		return Result{}, fmt.Errorf("%w: %q has ended", ErrNotFound, s.id)
	case s.busy:
		s.mu.Unlock()
		return Result{}, fmt.Errorf("%w: %q is running a command", ErrBusy, s.id)
	}
	s.busy, s.cur = true, c
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.busy, s.cur = false, nil
		s.mu.Unlock()
	}()

	began := s.m.cfg.Now()
	before := descendants(s.pid) // background jobs of earlier commands, spared by a kill
	if _, err := s.proc.WriteStdin([]byte(commandScript(r.Command, c.nonce))); err != nil {
		s.logger.Debug("writing a command to the shell", "err", err) // it has ended: below
	}
	var timeout <-chan time.Time
	if r.Timeout > 0 {
		t := time.NewTimer(r.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	timedOut := false
	select {
	case <-c.done:
	case <-timeout:
		timedOut = true
		s.interrupt(c, before)
	case <-ctx.Done():
		s.interrupt(c, before)
	}

	s.mu.Lock()
	res := c.result()
	res.TimedOut = timedOut
	res.DurationMS = s.m.cfg.Now().Sub(began).Milliseconds()
	codeText, cwd, ok := c.trailer()
	code, err := strconv.Atoi(codeText)
	ended := s.ended
	if ok && err == nil {
		res.ExitCode, res.Cwd = code, cwd
		s.cwd = cwd
	} else {
		ended = true
	}
	if !ended {
		s.commands++
		res.Cwd = s.cwd
	}
	s.mu.Unlock()
	if ended {
		<-s.gone // the process has ended: its status is final
		res.Ended, res.Cwd = true, ""
		if !ok || err != nil {
			res.ExitCode = -1
			if st := s.proc.Status(); st.ExitCode != nil {
				res.ExitCode, res.Signal = *st.ExitCode, st.Signal
			}
		}
	}
	s.mu.Lock()
	exit := res.ExitCode
	s.lastExit = &exit
	s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	return res, nil
}

func (s *Session) checkRun(r RunRequest) error {
	switch {
	case r.Command == "":
		return fmt.Errorf("%w: command is empty", ErrInvalid)
	case len(r.Command) > s.m.cfg.MaxCommandBytes:
		return fmt.Errorf("%w: command of %d bytes is over the limit of %d", ErrInvalid, len(r.Command), s.m.cfg.MaxCommandBytes)
	case strings.ContainsRune(r.Command, 0):
		return fmt.Errorf("%w: command contains a NUL byte", ErrInvalid)
	case r.Timeout < 0 || r.Timeout > process.MaxTimeout:
		return fmt.Errorf("%w: timeout must be between 0 and %d seconds", ErrInvalid, int(process.MaxTimeout.Seconds()))
	}
	return nil
}

// interrupt stops the command and not the shell when it can (see the package doc), and
// returns once the command is over or the shell is gone.
func (s *Session) interrupt(c *command, before map[int]bool) {
	grace := func() bool {
		t := time.NewTimer(s.m.cfg.InterruptGrace)
		defer t.Stop()
		select {
		case <-c.done:
			return true
		case <-t.C:
			return false
		}
	}
	if err := s.m.cfg.Processes.Signal(s.lease, s.id, "INT"); err != nil {
		s.logger.Debug("interrupting a command", "err", err)
	}
	if grace() {
		return
	}
	killNew(s.pid, before, s.logger)
	if grace() {
		return
	}
	s.logger.Warn("a command outlived its interrupt; killing its shell")
	s.kill()
}

// command is one command's framing state; the Session's mu guards it.
type command struct {
	nonce   string
	out     *process.Capture // its output; nil: dropped (the handshake)
	streams [2]*stream       // stdout, stderr
	done    chan struct{}
	closed  bool
}

func newCommand(nonce string, out *process.Capture) *command {
	return &command{
		nonce: nonce,
		out:   out,
		streams: [2]*stream{
			newStream(nonce, out, apitype.ChannelStdout), newStream(nonce, out, apitype.ChannelStderr),
		},
		done: make(chan struct{}),
	}
}

func (c *command) feed(channel byte, p []byte) {
	i := int(channel - apitype.ChannelStdout)
	if i < 0 || i > 1 {
		return
	}
	c.streams[i].feed(p)
	if c.streams[0].done && c.streams[1].done {
		c.end()
	}
}

func (c *command) end() {
	if !c.closed {
		c.closed = true
		for _, st := range c.streams {
			st.flush()
		}
		close(c.done)
	}
}

// trailer splits "a:b" of stdout's trailer; ok only when both markers came.
func (c *command) trailer() (a, b string, ok bool) {
	st := c.streams[0]
	if !st.done || !st.found {
		return "", "", false
	}
	a, b, ok = strings.Cut(string(st.trailer), ":")
	return a, b, ok
}

// result is the output so far; its strings share memory with c.out.
func (c *command) result() Result {
	var r Result
	r.Stdout, r.StdoutTruncated = c.out.Output(apitype.ChannelStdout)
	r.Stderr, r.StderrTruncated = c.out.Output(apitype.ChannelStderr)
	r.StdoutDropped, r.StdoutDroppedAt = c.out.Dropped(apitype.ChannelStdout)
	r.StderrDropped, r.StderrDroppedAt = c.out.Dropped(apitype.ChannelStderr)
	return r
}
