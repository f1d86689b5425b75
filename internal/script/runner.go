package script

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Runner runs scripts on a pool of worker processes. It is safe for concurrent use;
// callers beyond the pool size queue, served in turn per lease (queue.go).
type Runner struct {
	cfg      Config
	log      *slog.Logger
	asRoot   bool
	root     string // empty read-only WASI root shared by all workers
	cacheDir string
	ownCache bool
	cell     Cell // the workers' cgroups; nil when bounded by RLIMIT_DATA

	q      *queue
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	seq    atomic.Int64
	warm   chan struct{} // closed once slot 0 offered its first worker (or failed to start one)
	warmed sync.Once
	mu     sync.Mutex
	live   map[*proc]struct{}
	closed bool
}

// New validates cfg, fills in defaults and starts warming the worker pool in the
// background; Run waits for a warm worker. A disabled Runner only answers ErrDisabled.
func New(ctx context.Context, cfg Config) (*Runner, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	r := &Runner{cfg: cfg, log: cfg.Logger}
	if !cfg.Enabled {
		return r, nil
	}
	r.asRoot = os.Geteuid() == 0
	if _, err := os.Stat(cfg.HelperPath); err != nil {
		return nil, fmt.Errorf("script: helper: %w", err)
	}
	if err := r.makeDirs(); err != nil {
		r.removeDirs()
		return nil, err
	}
	if cfg.Cell != nil {
		if err := cfg.Cell.SetMemory(int64(cfg.Workers) * workerBudget(cfg.MaxMemoryBytes)); err != nil {
			r.removeDirs()
			return nil, fmt.Errorf("script: workers' cgroup: %w", err)
		}
		r.cell = cfg.Cell
	} else {
		r.log.Warn("script workers bounded by RLIMIT_DATA only: no cgroup")
	}
	r.q = newQueue(cfg.MaxPerLease, cfg.Workers)
	r.live = map[*proc]struct{}{}
	r.warm = make(chan struct{})
	r.ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	for slot := range cfg.Workers {
		r.wg.Add(1)
		go r.keepSlot(slot)
	}
	return r, nil
}

func (c *Config) fill() error {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.MaxPerLease <= 0 {
		c.MaxPerLease = max(1, c.Workers/2)
	}
	if c.HelperPath == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("script: helper path: %w", err)
		}
		c.HelperPath = exe
	}
	if c.WorkerArgs == nil {
		c.WorkerArgs = []string{workerSubcommand}
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.DefaultTimeout, DefaultTimeout)
	def(&c.MaxTimeout, DefaultMaxTimeout)
	def(&c.QueueWait, c.MaxTimeout+5*time.Second)
	def(&c.WorkerIdle, DefaultWorkerIdle)
	defInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defInt(&c.MaxSourceBytes, DefaultMaxSourceBytes)
	defInt(&c.MaxInputBytes, DefaultMaxInputBytes)
	defInt(&c.MaxResultBytes, DefaultMaxResultBytes)
	defInt(&c.MaxLogBytes, DefaultMaxLogBytes)
	defInt(&c.MaxLogLines, DefaultMaxLogLines)
	if c.DefaultMemoryBytes <= 0 {
		c.DefaultMemoryBytes = DefaultMemoryBytes
	}
	if c.MaxMemoryBytes <= 0 {
		c.MaxMemoryBytes = DefaultMaxMemoryBytes
	}
	if c.WorkerUID <= 0 {
		c.WorkerUID = DefaultWorkerUID
	}
	if c.WorkerGID <= 0 {
		c.WorkerGID = DefaultWorkerUID
	}
	if c.Seccomp == "" {
		c.Seccomp = "strict"
	}
	switch {
	case c.Seccomp != "strict" && c.Seccomp != "off":
		return fmt.Errorf("script: seccomp %q (want strict or off)", c.Seccomp)
	case c.DefaultTimeout > c.MaxTimeout:
		return fmt.Errorf("script: default timeout %v over max %v", c.DefaultTimeout, c.MaxTimeout)
	case c.DefaultMemoryBytes > c.MaxMemoryBytes || c.DefaultMemoryBytes < minMemoryBytes:
		return fmt.Errorf("script: default memory %d not in [%d, %d]", c.DefaultMemoryBytes, minMemoryBytes, c.MaxMemoryBytes)
	}
	return nil
}

// makeDirs creates the empty WASI root (read-only for the worker: root-owned 0555, and
// WASI has no chmod) and the compilation cache.
func (r *Runner) makeDirs() error {
	root, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", rootDirPrefix, os.Getpid()))
	if err != nil {
		return fmt.Errorf("script: root: %w", err)
	}
	r.root = root
	if err := os.Chmod(root, 0o555); err != nil {
		return fmt.Errorf("script: root: %w", err)
	}
	r.cacheDir = r.cfg.CacheDir
	if r.cacheDir == "" {
		if r.cacheDir, err = os.MkdirTemp("", fmt.Sprintf("%s%d-", cacheDirPrefix, os.Getpid())); err != nil {
			return fmt.Errorf("script: cache: %w", err)
		}
		r.ownCache = true
	} else if err := os.MkdirAll(r.cacheDir, 0o755); err != nil {
		return fmt.Errorf("script: cache: %w", err)
	}
	if err := os.Chmod(r.cacheDir, 0o755); err != nil {
		return fmt.Errorf("script: cache: %w", err)
	}
	if r.asRoot {
		r.warnUnreachable(r.cacheDir)
		// Only the first worker, before it has run any script, may write the cache;
		// sealCache takes the right back.
		return os.Chown(r.cacheDir, r.cfg.WorkerUID, r.cfg.WorkerGID)
	}
	return nil
}

// warnUnreachable warns when the worker uid cannot traverse to dir: workers then
// compile QuickJS themselves on every start (~1.4 s instead of ~0.3 s).
func (r *Runner) warnUnreachable(dir string) {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o001 == 0 {
			r.log.Warn("script compilation cache not reachable by the worker uid; workers will start slowly", "cache_dir", dir, "blocked_at", d)
			return
		}
		if d == filepath.Dir(d) {
			return
		}
	}
}

// sealCache makes the compilation cache root-owned, so a compromised worker cannot
// plant code that later workers would load.
func (r *Runner) sealCache() {
	if !r.asRoot {
		return
	}
	err := filepath.WalkDir(r.cacheDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(path, 0, 0); err != nil {
			return err
		}
		mode := fs.FileMode(0o644)
		if d.IsDir() {
			mode = 0o755
		}
		return os.Chmod(path, mode)
	})
	if err != nil {
		r.log.Warn("seal script compilation cache", "err", err)
	}
}

func (r *Runner) removeDirs() {
	if r.root != "" {
		_ = os.Remove(r.root)
	}
	if r.ownCache && r.cacheDir != "" {
		_ = os.RemoveAll(r.cacheDir)
	}
}

// keepSlot keeps one worker of the pool. Slot 0's is always there, so that a script
// never waits for a worker to start (~0.3 s) when the daemon is quiet. The others are
// made on demand (a caller no idle worker could take) and retired after
// Config.WorkerIdle without a script: each holds ~30 MiB, which an idle daemon need not.
func (r *Runner) keepSlot(slot int) {
	defer r.wg.Done()
	if slot > 0 {
		// Later workers load what the first one compiled, and start only once slot 0's
		// worker is offered: a caller that waited for the compile takes that one, and no
		// second worker starts for it.
		select {
		case <-r.warm:
		case <-r.ctx.Done():
			return
		}
	}
	backoff := 100 * time.Millisecond
	for first := true; ; first = false {
		// Parked: no worker until a caller needs one. A demand signal may be stale (its
		// caller was served meanwhile), hence the loop.
		for slot > 0 && !r.q.waiters() {
			select {
			case <-r.q.demand:
			case <-r.ctx.Done():
				return
			}
		}
		start := time.Now()
		p, err := r.spawnWorker(r.ctx, r.seq.Add(1))
		if slot == 0 && first {
			r.sealCache()
			if err == nil {
				// This worker compiled QuickJS and keeps the compiler's memory (~90 MiB
				// resident against ~30 MiB for one that loads the cache): one that
				// loads it takes its place.
				r.release(p)
				continue
			}
		}
		if err != nil {
			if slot == 0 {
				r.markWarm() // the other slots try on their own
			}
			if r.ctx.Err() != nil {
				return
			}
			r.log.Error("script worker start failed", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
				backoff = min(2*backoff, 5*time.Second)
				continue
			case <-r.ctx.Done():
				return
			}
		}
		backoff = 100 * time.Millisecond
		r.log.Debug("script worker ready", "worker", p.id, "pid", p.cmd.Process.Pid, "landlock", p.landlock, "start", time.Since(start))
		if p.landlock == 0 && first {
			r.log.Warn("script workers run without Landlock (kernel lacks it)")
		}
		if !r.track(p) {
			r.release(p)
			return
		}
		r.q.offer(p)
		if slot == 0 {
			r.markWarm()
		}
		if !r.serve(slot, p) {
			return
		}
	}
}

// markWarm lets the slots beyond the first start their workers (once).
func (r *Runner) markWarm() { r.warmed.Do(func() { close(r.warm) }) }

// serve waits until slot's worker p is gone: exited (killed after a failed script, or
// died), or, for a slot other than 0, retired idle. It returns false when the Runner
// closes.
func (r *Runner) serve(slot int, p *proc) bool {
	var idle <-chan time.Time
	if slot > 0 {
		t := time.NewTicker(r.cfg.WorkerIdle / 2)
		defer t.Stop()
		idle = t.C
	}
	for {
		select {
		case <-p.exited:
			r.q.remove(p) // died while idle: no caller gets it
		case <-idle:
			if !r.q.retire(p, time.Now().Add(-r.cfg.WorkerIdle)) {
				continue
			}
			r.log.Debug("script worker retired idle", "worker", p.id)
		case <-r.ctx.Done():
			return false
		}
		r.untrack(p)
		r.release(p)
		return true
	}
}

func (r *Runner) track(p *proc) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.live[p] = struct{}{}
	return true
}

func (r *Runner) untrack(p *proc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.live, p)
}

// release kills a worker and removes its cgroup.
func (r *Runner) release(p *proc) {
	p.kill()
	if p.cgroup != "" {
		p.lastOOMKills.Store(r.cell.OOMKills(p.cgroup))
		if err := r.cell.RemoveChild(context.Background(), p.cgroup); err != nil {
			r.log.Warn("remove script worker cgroup", "err", err)
		}
	}
}

// Run runs one script and returns its result, or an *Error for the script's own
// failures, ErrDisabled, ErrClosed or the context's error.
func (r *Runner) Run(ctx context.Context, req Request) (Result, error) {
	if !r.cfg.Enabled {
		return Result{}, ErrDisabled
	}
	j, timeout, err := r.validate(req)
	if err != nil {
		return Result{}, err
	}
	// The wait for a worker is bounded on its own (QueueWait): the script's timeout
	// starts once it runs, so a queue cannot eat it.
	p, err := r.q.get(ctx, r.ctx, req.Lease, req.Lease != "", r.cfg.QueueWait)
	if err != nil {
		return Result{}, err
	}
	res, healthy, err := r.exec(ctx, p, j, timeout)
	if !healthy {
		p.kill() // its slot sees it exit and starts a replacement
		p = nil
	}
	r.q.put(req.Lease, p)
	return res, err
}

func (r *Runner) validate(req Request) (job, time.Duration, error) {
	c := r.cfg
	timeout, mem := req.Timeout, req.MemoryBytes
	if timeout == 0 {
		timeout = c.DefaultTimeout
	}
	if mem == 0 {
		mem = c.DefaultMemoryBytes
	}
	switch {
	case req.Source == "":
		return job{}, 0, invalid("source is empty")
	case len(req.Source) > c.MaxSourceBytes:
		return job{}, 0, invalid("source is %d bytes, over the %d byte limit", len(req.Source), c.MaxSourceBytes)
	case len(req.Input) > c.MaxInputBytes:
		return job{}, 0, invalid("input is %d bytes, over the %d byte limit", len(req.Input), c.MaxInputBytes)
	case len(req.Input) > 0 && !json.Valid(req.Input):
		return job{}, 0, invalid("input is not valid JSON")
	case timeout < 0 || timeout > c.MaxTimeout:
		return job{}, 0, invalid("timeout %v not in (0, %v]", timeout, c.MaxTimeout)
	case mem < minMemoryBytes || mem > c.MaxMemoryBytes:
		return job{}, 0, invalid("memory %d bytes not in [%d, %d]", mem, minMemoryBytes, c.MaxMemoryBytes)
	}
	input := req.Input
	if len(input) == 0 {
		input = json.RawMessage("null")
	}
	return job{Source: req.Source, Input: input, MemoryBytes: mem}, timeout, nil
}

// exec runs j on p. healthy reports whether p may serve another job.
func (r *Runner) exec(ctx context.Context, p *proc, j job, timeout time.Duration) (res Result, healthy bool, err error) {
	budget := workerBudget(j.MemoryBytes)
	if p.cgroup != "" && p.limit != budget { // a cgroupfs write only when the limit changes
		// Lowering the limit fails while the worker still holds more than that; the
		// pool-wide limit and the watchdog below still hold then.
		if err := r.cell.SetChildMemory(p.cgroup, budget); err != nil {
			r.log.Debug("script worker limit not lowered", "worker", p.id, "err", err)
		} else {
			p.limit = budget
		}
	}
	start := time.Now()
	replies := make(chan error, 1)
	var rep reply
	go func() {
		if err := writeFrame(p.in, j); err != nil {
			replies <- err
			return
		}
		replies <- readFrame(p.out, r.cfg.MaxResultBytes+2*r.cfg.MaxLogBytes+(64<<10), &rep)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	watch := time.NewTicker(watchInterval)
	defer watch.Stop()
	var oomBefore int64
	if p.cgroup != "" {
		oomBefore = r.cell.OOMKills(p.cgroup)
	}
	for {
		select {
		case err := <-replies:
			d := time.Since(start)
			if err != nil {
				// Let it finish dying on its own, so its exit status says who killed it.
				died := false
				select {
				case <-p.exited:
					died = true
				case <-time.After(time.Second):
				}
				p.kill()
				return Result{}, false, r.crashError(p, died, oomBefore, err)
			}
			if rep.Error != nil {
				return Result{}, !rep.Unusable, rep.Error
			}
			return Result{Result: rep.Result, Logs: rep.Logs, Duration: d}, !rep.Unusable, nil
		case <-timer.C:
			return Result{}, false, &Error{Kind: KindTimeout, Message: fmt.Sprintf("script ran over its %v limit", timeout)}
		case <-ctx.Done():
			return Result{}, false, ctx.Err()
		case <-watch.C:
			if rss := p.rss(); rss > budget {
				return Result{}, false, &Error{Kind: KindMemory, Message: fmt.Sprintf("script used over %d bytes", j.MemoryBytes)}
			}
		}
	}
}

// crashError explains a worker that died mid-job. A SIGKILL we did not send comes from
// the kernel's OOM killer: the worker's cgroup limit (which its OOM count shows) or,
// without cgroups, the daemon's host.
func (r *Runner) crashError(p *proc, died bool, oomBefore int64, cause error) error {
	if p.cgroup != "" && max(r.cell.OOMKills(p.cgroup), p.lastOOMKills.Load()) > oomBefore {
		return &Error{Kind: KindMemory, Message: fmt.Sprintf(
			"script ran out of memory: the kernel killed its worker at the %d byte limit of its cgroup (the script's memory_bytes, tripled for the runtime's copies, plus %d bytes for the worker)",
			p.limit, int64(workerOverhead))}
	}
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); died && ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		return &Error{Kind: KindMemory, Message: "script ran out of memory: its worker was killed"}
	}
	if errors.Is(cause, errFrameTooLarge) {
		return invalid("script output too large")
	}
	r.log.Warn("script worker died", "worker", p.id, "err", cause, "state", p.cmd.ProcessState.String(), "stderr", p.stderr.String())
	return &Error{Kind: KindException, Message: "script crashed its runtime"}
}

// Close kills the workers and removes the cgroups and temporary directories.
func (r *Runner) Close() error {
	if !r.cfg.Enabled {
		return nil
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	live := make([]*proc, 0, len(r.live))
	for p := range r.live {
		live = append(live, p)
	}
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	for _, p := range live {
		r.release(p)
	}
	var err error
	if r.cell != nil {
		err = r.cell.Remove(context.Background())
	}
	r.removeDirs()
	return err
}
