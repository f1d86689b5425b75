package sidecar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/lease/disk"
	"github.com/sidecar-sandbox/sidecar/sidecar/process"
	"github.com/sidecar-sandbox/sidecar/sidecar/sandbox"
	"github.com/sidecar-sandbox/sidecar/sidecar/script"
)

// Config is the daemon's whole configuration, already read and checked (cmd/sidecar
// builds it from the environment).
type Config struct {
	Version       string
	SharedToken   string // ≥ 32 characters
	PreviousToken string // accepted during a rotation; "" when none
	ListenAddr    string
	TLS           *tls.Config
	CertNotAfter  func() time.Time

	StateDir, WorkRoot string

	MaxLeases                int
	DefaultTTL, MaxTTL       time.Duration
	DefaultLimits, MaxLimits lease.Limits
	UIDFirst, UIDLast        int
	CgroupParent             string
	Isolation                string // "strict" or "none"
	Seccomp                  string // "strict" (default) or "off": the system-call filter on lease processes and script workers
	MinLandlockABI           int    // operator's floor: refuse to start below it; 0 none
	RequireCgroup            string // operator's floor: "v1", "v2" or "" (either)
	LandlockMaxABI           int    // caps the Landlock ABI lease processes get (tests); 0 the kernel's
	// DiskQuota is how lease disk limits are enforced: "auto" (default: a loop-mounted
	// filesystem per lease when the host allows, else refuse in strict isolation), "loop"
	// or "off" (the API meter only). See lease/disk.
	DiskQuota      string
	AllowedOrigins []string

	MaxOutputBytes    int64 // run-to-completion output cap per stream
	OutputBufferBytes int64 // replay buffer per background process
	MaxProcesses      int   // background processes per lease
	MaxPTYs           int   // PTYs per lease (its own devpts instance); default sandbox.DefaultMaxPTYs
	MaxExecs          int   // run-to-completion execs per lease at once
	OutputBudgetBytes int64 // output all execs hold in memory, daemon-wide

	ScriptEnabled bool
	ScriptWorkers int

	HelperPath   string // the daemon binary, run as the script worker (and the sandbox helper when no sidecar-init sits beside it); default os.Executable()
	HTTP         HTTPLimits
	ReapInterval time.Duration // default 10s
	UploadIdle   time.Duration // partial uploads idle this long are reaped; default 24h

	Now    func() time.Time
	Logger *slog.Logger
}

// Daemon is a running sidecar: every part opened, the listener bound.
type Daemon struct {
	Server *Server
	log    *slog.Logger

	leases  *lease.Manager
	procs   *process.Manager
	sandbox *sandbox.Sandbox
	scripts *script.Runner
	disk    *disk.Quotas

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	serveErr chan error
	once     sync.Once
}

// Start opens state, sets up isolation, sweeps what a previous run left, binds the
// listener and serves in the background. When it returns the daemon is ready.
func Start(ctx context.Context, cfg Config) (d *Daemon, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = 10 * time.Second
	}
	if cfg.UploadIdle <= 0 {
		cfg.UploadIdle = 24 * time.Hour
	}
	if len(cfg.SharedToken) < 32 {
		return nil, errors.New("sidecar: the shared token must be at least 32 characters")
	}
	log := cfg.Logger
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	if err := os.MkdirAll(cfg.WorkRoot, 0o711); err != nil {
		return nil, fmt.Errorf("work root: %w", err)
	}
	if abs, _ := filepath.Abs(cfg.WorkRoot); cfg.Isolation != "none" && (abs == "/tmp" || strings.HasPrefix(abs, "/tmp/")) {
		// Every lease process gets its own /tmp mounted over the host's: a work root
		// below /tmp would be hidden from the very processes that need it.
		return nil, fmt.Errorf("work root %s is under /tmp, which each lease's private /tmp hides: set SIDECAR_WORK_ROOT (or SIDECAR_STATE_DIR) elsewhere, e.g. /var/lib/sidecar", abs)
	}
	if err := traversable(cfg.WorkRoot, cfg.StateDir); err != nil {
		return nil, err
	}

	closers := []func(){}
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				closers[i]()
			}
		}
	}()

	stateAbs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	sb, err := sandbox.New(sandbox.Config{
		CgroupParent:   cfg.CgroupParent,
		Isolation:      cfg.Isolation,
		HelperPath:     sandboxHelper(cfg.HelperPath),
		Logger:         log.With("component", "sandbox"),
		MinLandlockABI: cfg.MinLandlockABI,
		RequireCgroup:  cfg.RequireCgroup,
		LandlockMaxABI: cfg.LandlockMaxABI,
		Owner:          stateAbs,
		Seccomp:        cfg.Seccomp,
		PTYRoot:        filepath.Join(cfg.StateDir, "pts"),
		MaxPTYs:        cfg.MaxPTYs,
	})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = sb.Close() })
	if cfg.Isolation == "none" {
		log.Warn("ISOLATION IS OFF: lease processes run as the daemon's user, without cgroups, uid separation or Landlock; use only for development", "isolation", "none")
	}
	if err := sandbox.BecomeSubreaper(); err != nil {
		log.Warn("cannot become a child subreaper: orphaned lease processes will be reparented to init", "err", err)
	}

	procs, err := process.New(process.Config{
		Execer:            sb,
		StateDir:          filepath.Join(cfg.StateDir, "processes"),
		MaxOutputBytes:    cfg.MaxOutputBytes,
		BufferBytes:       cfg.OutputBufferBytes,
		MaxProcesses:      cfg.MaxProcesses,
		MaxExecs:          cfg.MaxExecs,
		OutputBudgetBytes: cfg.OutputBudgetBytes,
		Now:               cfg.Now,
		Logger:            log.With("component", "process"),
	})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { procs.Shutdown(context.Background()) })

	quotas, err := disk.New(ctx, disk.Config{
		Mode:         cfg.DiskQuota,
		WorkRoot:     cfg.WorkRoot,
		DefaultBytes: cfg.DefaultLimits.DiskBytes,
		MaxLeases:    cfg.MaxLeases,
		Strict:       cfg.Isolation != "none",
		Logger:       log.With("component", "disk"),
	})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = quotas.Close() })

	rt := &Runtime{Sandbox: sb, Processes: procs, UploadIdle: cfg.UploadIdle, Disk: quotas, Logger: log}
	secrets := [][]byte{[]byte(cfg.SharedToken)}
	if cfg.PreviousToken != "" {
		secrets = append(secrets, []byte(cfg.PreviousToken))
	}
	tokens, err := lease.NewTokens(cfg.StateDir, secrets...)
	if err != nil {
		return nil, err
	}
	// Token expiry and lease expiry must read the same clock.
	tokens = tokens.WithClock(cfg.Now)

	// Lease events feed the server's metrics; the server is built after the manager.
	var srvRef atomic.Pointer[Server]
	leases, err := lease.Open(ctx, lease.Config{
		StateDir:      cfg.StateDir,
		WorkRoot:      cfg.WorkRoot,
		DefaultTTL:    cfg.DefaultTTL,
		MaxTTL:        cfg.MaxTTL,
		MaxLeases:     cfg.MaxLeases,
		DefaultLimits: cfg.DefaultLimits,
		MaxLimits:     cfg.MaxLimits,
		UIDFirst:      cfg.UIDFirst,
		UIDLast:       cfg.UIDLast,
		Provisioner:   rt,
		Disk:          quotas,
		Now:           cfg.Now,
		Logger:        log.With("component", "lease"),
		OnEvent: func(e lease.Event) {
			if s := srvRef.Load(); s != nil {
				s.metrics.leaseEvent(e)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { _ = leases.Close() })

	// Processes of a previous run have no pipes to us any more: they are reported lost
	// (the process records say so) and killed, never left running unsupervised.
	for _, l := range leases.List() {
		if err := sb.Teardown(ctx, l.ID); err != nil {
			log.Warn("cannot clear a lease's previous processes", "lease", l.ID, "err", err)
		}
		if err := rt.Provision(ctx, l); err != nil {
			log.Warn("cannot restore a lease's sandbox", "lease", l.ID, "err", err)
		}
		// Writes a crash interrupted left temporaries beside their targets; they go
		// before anything of the lease runs or is served again.
		if f, err := rt.FS(l); err == nil {
			if n, err := f.SweepTemps(ctx); err != nil {
				log.Warn("cannot sweep a lease's interrupted writes", "lease", l.ID, "err", err)
			} else if n > 0 {
				log.Info("removed interrupted writes", "lease", l.ID, "count", n)
			}
		}
	}

	// What a previous run left and the state does not account for goes now.
	if res, err := rt.Cleanup(ctx, leases); err != nil {
		log.Warn("startup sweep incomplete", "err", err)
	} else if n := len(res.Leases) + len(res.Cgroups) + len(res.Workdirs) + len(res.Processes); n > 0 {
		log.Info("startup sweep", "leases", res.Leases, "cgroups", res.Cgroups, "workdirs", res.Workdirs, "processes", res.Processes)
	}

	var scripts *script.Runner
	if removed, err := script.CleanupStale("", ""); err != nil {
		log.Warn("script worker sweep incomplete", "err", err)
	} else if len(removed) > 0 {
		log.Info("removed script workers' leftovers", "paths", removed)
	}
	if cfg.ScriptEnabled {
		scripts, err = script.New(ctx, script.Config{
			Enabled:    true,
			Workers:    cfg.ScriptWorkers,
			HelperPath: cfg.HelperPath,
			Seccomp:    cfg.Seccomp,
			CacheDir:   filepath.Join(cfg.StateDir, "script-cache"),
			Logger:     log.With("component", "script"),
		})
		if err != nil {
			return nil, err
		}
		closers = append(closers, func() { _ = scripts.Close() })
	}

	srv := NewServer(ServerOptions{
		Logger:         log,
		Version:        cfg.Version,
		SharedTokens:   []string{cfg.SharedToken, cfg.PreviousToken},
		Tokens:         tokens,
		Leases:         leases,
		Runtime:        rt,
		Processes:      procs,
		Sandbox:        sb,
		Scripts:        scripts,
		AllowedOrigins: cfg.AllowedOrigins,
		Limits:         cfg.HTTP,
		CertNotAfter:   cfg.CertNotAfter,
		Now:            cfg.Now,
		HostPaths:      []string{cfg.WorkRoot, cfg.StateDir},
		Info: apitype.Info{
			Limits: apitype.ServiceLimits{
				MaxLeases:        cfg.MaxLeases,
				MaxTTLSeconds:    int64(cfg.MaxTTL.Seconds()),
				MaxBodyBytes:     cfg.HTTP.MaxJSONBytes,
				MaxOutputBytes:   cfg.MaxOutputBytes,
				OutputBufferSize: cfg.OutputBufferBytes,
				MaxLimits:        apiLimits(cfg.MaxLimits),
			},
			Capabilities:  apitype.Capabilities{DiskQuota: quotas.Mode()},
			DefaultLimits: apiLimits(cfg.DefaultLimits),
			DefaultTTL:    int64(cfg.DefaultTTL.Seconds()),
		},
	})
	srvRef.Store(srv)
	if err := srv.Listen(cfg.ListenAddr, cfg.TLS); err != nil {
		return nil, err
	}

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d = &Daemon{Server: srv, log: log, leases: leases, procs: procs, sandbox: sb, scripts: scripts, disk: quotas, cancel: cancel, serveErr: make(chan error, 1)}
	d.wg.Add(3)
	go func() { defer d.wg.Done(); d.serveErr <- srv.Serve() }()
	go func() { defer d.wg.Done(); leases.Run(runCtx, cfg.ReapInterval) }()
	// Orphaned lease processes are reparented to us (subreaper); reap their zombies so
	// they never count against a lease's pids limit.
	go func() { defer d.wg.Done(); sandbox.RunReaper(runCtx, log.With("component", "reaper")) }()
	caps := sb.Caps()
	log.Info("sidecar serving", "addr", srv.Addr().String(), "version", cfg.Version, "isolation", caps.Isolation,
		"cgroups", caps.Cgroups, "landlock_abi", caps.LandlockABI, "layers", strings.Join(caps.Layers, ","), "seccomp", caps.Seccomp, "disk_quota", quotas.Mode())
	for _, gap := range caps.Gaps() {
		log.Warn("isolation layer missing on this kernel", "landlock_abi", caps.LandlockABI, "gap", gap)
	}
	return d, nil
}

// Addr is where the daemon listens.
func (d *Daemon) Addr() net.Addr { return d.Server.Addr() }

// Done reports a fatal serve error (or nil after Close).
func (d *Daemon) Done() <-chan error { return d.serveErr }

// Close shuts down: stop accepting, give in-flight requests the shutdown deadline, stop
// the reaper and the script workers, and persist state. Lease processes keep running:
// leases survive a restart, and a later daemon reports processes it lost.
func (d *Daemon) Close(ctx context.Context) error {
	var err error
	d.once.Do(func() {
		sctx, cancel := context.WithTimeout(ctx, d.Server.opts.Limits.ShutdownTimeout)
		defer cancel()
		err = d.Server.Shutdown(sctx)
		d.cancel()
		d.wg.Wait()
		d.procs.Shutdown(sctx)
		err = errors.Join(err, d.sandbox.Close()) // background cgroup work, spare cgroups
		if d.scripts != nil {
			_ = d.scripts.Close()
		}
		err = errors.Join(err, d.leases.Close(), d.disk.Close()) // mounts stay: leases survive a restart
		d.log.Info("sidecar stopped")
	})
	return err
}

// sandboxHelper is what starts lease processes: the small sidecar-init beside the daemon
// binary when there is one (it starts several times faster than the daemon's own binary
// run as `sidecar __sandbox-init`), else the daemon binary. "" lets the sandbox look
// beside os.Executable() itself.
func sandboxHelper(daemonBinary string) string {
	if daemonBinary == "" {
		return ""
	}
	tiny := filepath.Join(filepath.Dir(daemonBinary), "sidecar-init")
	if st, err := os.Stat(tiny); err == nil && st.Mode().IsRegular() {
		return tiny
	}
	return daemonBinary
}

// traversable lets lease uids walk down to their workdirs (and list nothing on the
// way): the work root and, when it lies inside the state dir, the state dir become 0711
// (every file in the state dir is 0600 or in a 0700 directory). Any other ancestor that
// others cannot traverse is a configuration error, reported now rather than as a
// baffling "permission denied" inside every lease.
func traversable(workRoot, stateDir string) error {
	abs, err := filepath.Abs(workRoot)
	if err != nil {
		return err
	}
	if err := os.Chmod(abs, 0o711); err != nil {
		return fmt.Errorf("work root: %w", err)
	}
	stateAbs, _ := filepath.Abs(stateDir)
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		fi, err := os.Stat(dir)
		if err != nil {
			return fmt.Errorf("work root: %w", err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if dir != stateAbs {
				return fmt.Errorf("work root %s: its ancestor %s is not traversable by other users (mode %04o): lease uids could not reach their workdirs; set SIDECAR_WORK_ROOT (or SIDECAR_STATE_DIR) to a directory every ancestor of which others may traverse, e.g. /var/lib/sidecar", abs, dir, fi.Mode().Perm())
			}
			if err := os.Chmod(dir, fi.Mode().Perm()|0o011); err != nil {
				return fmt.Errorf("state dir: %w", err)
			}
		}
		if dir == "/" || dir == filepath.Dir(dir) {
			return nil
		}
	}
}

func apiLimits(l lease.Limits) apitype.Limits {
	return apitype.Limits{MemoryBytes: l.MemoryBytes, CPUMillicores: l.CPUMillicores, Pids: l.Pids, DiskBytes: l.DiskBytes}
}

// Healthy is the watchdog's question: does the lease table still answer? A deadlock
// there would hang every request, and systemd should restart us rather than wait.
func (d *Daemon) Healthy() bool {
	done := make(chan struct{})
	go func() { d.leases.List(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}
