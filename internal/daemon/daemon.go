// Package daemon is the sidecar program: it opens the daemon's parts (sandbox,
// processes, disk quotas, lease table, script workers), restores the leases a previous
// run left, sweeps what no lease accounts for, and serves them over the HTTP server of
// package sidecar; Close undoes it. cmd/sidecar's serve reads the configuration and
// calls Start.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/fsxfer"
	"github.com/sidecar-sandbox/sidecar/internal/confine"
	"github.com/sidecar-sandbox/sidecar/internal/process"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/internal/script"
	"github.com/sidecar-sandbox/sidecar/internal/shell"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/lease/disk"
	"github.com/sidecar-sandbox/sidecar/lease/image"
	"github.com/sidecar-sandbox/sidecar/sidecar"
)

// Daemon is a running sidecar: every part opened, the listener bound.
type Daemon struct {
	cfg Config
	log *slog.Logger

	sandbox *sandbox.Sandbox
	// mountRoots are the state dir and work root as mount points (nil: isolation none).
	mountRoots *sandbox.MountRoots
	helperNS   *os.File // mountRoots.HelperMountNS, for the sandbox
	network    leaseNetwork
	procs      *process.Manager
	shells     *shell.Manager
	disk       *disk.Quotas
	images     *image.Store
	// defaultImage is SIDECAR_DEFAULT_IMAGE's image; "": the host's root.
	defaultImage string
	rootImages   map[string]bool // SIDECAR_ROOT_IMAGES
	rt           *Runtime
	tokens       *lease.Tokens
	leases       *lease.Manager
	scripts      *script.Runner // nil: scripts disabled
	leaseMetrics *sidecar.LeaseMetrics
	srv          *sidecar.Server // nil until it listens

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	serveErr chan error
	once     sync.Once
}

// Start is the daemon's whole life up to serving, in order: open every part, restore
// the leases a previous run left, sweep what no lease accounts for, and serve. When it
// returns the daemon is ready; on an error, whatever was opened is closed again.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
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
	if cfg.HTTP.ShutdownTimeout <= 0 {
		cfg.HTTP.ShutdownTimeout = 15 * time.Second
	}
	d := &Daemon{cfg: cfg, log: cfg.Logger, leaseMetrics: sidecar.NewLeaseMetrics(), serveErr: make(chan error, 1), cancel: func() {}}
	if err := d.open(ctx); err != nil {
		_ = d.Close(ctx)
		return nil, err
	}
	d.restore(ctx)
	d.sweep(ctx)
	d.startImages()
	if err := d.serve(ctx); err != nil {
		_ = d.Close(ctx)
		return nil, err
	}
	return d, nil
}

// open makes the state dir and work root and opens every part: sandbox, processes,
// disk quotas, tokens, the lease table and the script workers.
func (d *Daemon) open(ctx context.Context) error {
	cfg, log := d.cfg, d.log
	if err := outsideTmp(cfg); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := os.MkdirAll(cfg.WorkRoot, 0o711); err != nil {
		return fmt.Errorf("work root: %w", err)
	}
	if err := traversable(cfg.WorkRoot, cfg.StateDir); err != nil {
		return err
	}
	stateAbs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return err
	}
	helper := cfg.HelperPath
	if helper != "" {
		helper = sandbox.HelperBeside(helper)
	}
	leasePath, err := sandbox.LeasePathDirs(cfg.LeasePath)
	if err != nil {
		return err
	}
	// Strict isolation's lease helpers detach these (sandbox.BindMountRoots).
	if cfg.Isolation != "none" {
		workAbs, err := filepath.Abs(cfg.WorkRoot)
		if err != nil {
			return err
		}
		roots := []string{stateAbs, workAbs}
		if d.mountRoots, err = sandbox.BindMountRoots(roots, filepath.Join(cfg.StateDir, "mount-roots"), log.With("component", "sandbox")); err != nil {
			return err
		}
		if d.helperNS, err = d.mountRoots.HelperMountNS(); err != nil {
			log.Warn("cannot make the helpers' mount namespace: each lease's helpers copy the daemon's, a mount per lease held", "component", "sandbox", "err", err)
		}
	}
	if d.sandbox, err = sandbox.New(sandbox.Config{
		DetachRoots:    d.mountRoots.Dirs(),
		HelperMountNS:  d.helperNS,
		LeasePath:      leasePath,
		CgroupParent:   cfg.CgroupParent,
		Isolation:      cfg.Isolation,
		HelperPath:     helper,
		Logger:         log.With("component", "sandbox"),
		MinLandlockABI: cfg.MinLandlockABI,
		RequireCgroup:  cfg.RequireCgroup,
		LandlockMaxABI: cfg.LandlockMaxABI,
		Owner:          stateAbs,
		Seccomp:        cfg.Seccomp,
		PTYRoot:        filepath.Join(cfg.StateDir, "pts"),
		UserRoot:       filepath.Join(cfg.StateDir, "users"),
		MaxPTYs:        cfg.MaxPTYs,
	}); err != nil {
		return err
	}
	if cfg.Isolation == "none" {
		log.Warn("ISOLATION IS OFF: lease processes run as the daemon's user, without cgroups, uid separation or Landlock; use only for development", "isolation", "none")
	}
	if err := confine.BecomeSubreaper(); err != nil {
		log.Warn("cannot become a child subreaper: orphaned lease processes will be reparented to init", "err", err)
	}
	if d.procs, err = process.New(process.Config{
		Execer:            d.sandbox,
		StateDir:          filepath.Join(cfg.StateDir, "processes"),
		MaxOutputBytes:    cfg.MaxOutputBytes,
		BufferBytes:       cfg.OutputBufferBytes,
		MaxProcesses:      cfg.MaxProcesses,
		MaxExecs:          cfg.MaxExecs,
		OutputBudgetBytes: cfg.OutputBudgetBytes,
		Now:               cfg.Now,
		Logger:            log.With("component", "process"),
	}); err != nil {
		return err
	}
	if d.disk, err = disk.New(ctx, disk.Config{
		Mode:         cfg.DiskQuota,
		WorkRoot:     cfg.WorkRoot,
		DefaultBytes: cfg.DefaultLimits.DiskBytes,
		MaxLeases:    cfg.MaxLeases,
		Strict:       cfg.Isolation != "none",
		Logger:       log.With("component", "disk"),
	}); err != nil {
		return err
	}
	if d.shells, err = shell.New(shell.Config{
		Processes:   d.procs, // its output limit and budget, shared with execs
		MaxSessions: cfg.MaxShells,
		Now:         cfg.Now,
		Logger:      log.With("component", "shell"),
	}); err != nil {
		return err
	}
	if d.network, err = cfg.Network.open(cfg.Isolation, d.sandbox.Caps(), log); err != nil {
		return err
	}
	// Searches and watches of every lease draw on these: the daemon's memory for greps,
	// and a quarter of root's inotify instances and watches.
	budgets, err := fsxfer.NewBudgets(fsxfer.BudgetConfig{MaxSearches: cfg.MaxSearches, SearchBytes: cfg.SearchBudgetBytes})
	if err != nil {
		return err
	}
	bc := budgets.Config()
	leaseInst, leaseWatches := budgets.LeaseInotify()
	log.Info("file tool budgets", "max_searches", bc.MaxSearches, "search_budget_bytes", bc.SearchBytes,
		"inotify_instances", bc.InotifyInstances, "inotify_watches", bc.InotifyWatches,
		"lease_inotify_instances", leaseInst, "lease_inotify_watches", leaseWatches)
	if d.images, d.defaultImage, err = cfg.Images.open(cfg.StateDir, log.With("component", "image")); err != nil {
		return err
	}
	ownedImages := false
	if cfg.Images.Images != "" {
		// Leases own their image's files where its layers can be id-mapped; root leases
		// need it, the others read the image's files as root's without it.
		err := d.sandbox.ProbeRootLeases(filepath.Join(cfg.StateDir, "images"))
		d.rootImages, ownedImages = cfg.Images.rootImages(), err == nil
		if err != nil && len(d.rootImages) > 0 {
			return fmt.Errorf("SIDECAR_ROOT_IMAGES=%s: %w", cfg.Images.Root, err)
		}
		if err != nil {
			log.Info("leases on images read the image's files as root's and cannot change them (no id-mapped layers here)", "reason", err)
		}
	}
	d.rt = &Runtime{Sandbox: d.sandbox, Processes: d.procs, Shells: d.shells, UploadIdle: cfg.UploadIdle, Disk: d.disk, Budgets: budgets, Network: d.network.manager, Images: d.images, RootImages: d.rootImages, OwnedImages: ownedImages}
	secrets := [][]byte{[]byte(cfg.SharedToken)}
	if cfg.PreviousToken != "" {
		secrets = append(secrets, []byte(cfg.PreviousToken))
	}
	tokens, err := lease.NewTokens(cfg.StateDir, secrets...)
	if err != nil {
		return err
	}
	// Token expiry and lease expiry must read the same clock.
	d.tokens = tokens.WithClock(cfg.Now)
	if d.leases, err = lease.Open(ctx, lease.Config{
		StateDir:       cfg.StateDir,
		WorkRoot:       cfg.WorkRoot,
		DefaultTTL:     cfg.DefaultTTL,
		MaxTTL:         cfg.MaxTTL,
		MaxLeases:      cfg.MaxLeases,
		Spares:         cfg.LeaseSpares,
		DefaultLimits:  cfg.DefaultLimits,
		MaxLimits:      cfg.MaxLimits,
		UIDFirst:       cfg.UIDFirst,
		UIDLast:        cfg.UIDLast,
		Provisioner:    d.rt,
		Disk:           d.disk,
		DefaultNetwork: d.network.def,
		CheckNetwork:   d.network.check,
		DefaultImage:   d.defaultImage,
		CheckImage:     d.images.Check,
		SpareCurrent:   d.rt.SpareCurrent,
		Now:            cfg.Now,
		Logger:         log.With("component", "lease"),
		OnEvent:        d.leaseMetrics.Observe,
	}); err != nil {
		return err
	}
	if removed, err := script.CleanupStale(""); err != nil {
		log.Warn("script worker sweep incomplete", "err", err)
	} else if len(removed) > 0 {
		log.Info("removed script workers' leftovers", "paths", removed)
	}
	if cfg.ScriptEnabled {
		return d.openScripts(ctx)
	}
	return nil
}

// openScripts starts the script workers. With cgroups (strict isolation) they run in
// the cell "scripts" under the daemon's cgroup parent, where the kernel bounds their
// memory as it bounds a lease's; a daemon that cannot make it does not start.
func (d *Daemon) openScripts(ctx context.Context) error {
	cfg, log := d.cfg, d.log
	sc := script.Config{
		Enabled:     true,
		Workers:     cfg.ScriptWorkers,
		MaxPerLease: cfg.ScriptMaxPerLease,
		HelperPath:  cfg.HelperPath,
		Seccomp:     cfg.Seccomp,
		CacheDir:    filepath.Join(cfg.StateDir, "script-cache"),
		Logger:      log.With("component", "script"),
	}
	if d.sandbox.Caps().Cgroups != "none" {
		cell, err := confine.NewCell(cfg.CgroupParent, scriptCell, log.With("component", "sandbox"))
		if err != nil {
			return fmt.Errorf("script workers' cgroup: %w", err)
		}
		sc.Cell = cell
	}
	var err error
	if d.scripts, err = script.New(ctx, sc); err != nil {
		if sc.Cell != nil {
			_ = sc.Cell.Remove(context.WithoutCancel(ctx))
		}
		return err
	}
	return nil
}

// scriptCell names the script workers' cgroup under the cgroup parent.
const scriptCell = "scripts"

// restore brings back the leases of a previous run. Their processes have no pipes to us
// any more: they are reported lost (the process records say so) and killed, never left
// running unsupervised.
func (d *Daemon) restore(ctx context.Context) {
	for _, l := range d.leases.List() {
		if err := d.sandbox.Remove(ctx, l.ID); err != nil {
			d.log.Warn("cannot clear a lease's previous processes", "lease", l.ID, "err", err)
		}
		if err := d.rt.Provision(ctx, l); err != nil {
			d.log.Warn("cannot restore a lease's sandbox", "lease", l.ID, "err", err)
		}
		// Writes a crash interrupted left temporaries beside their targets; they go
		// before anything of the lease runs or is served again.
		if f, err := d.rt.FS(l); err == nil {
			if n, err := f.SweepTemps(ctx); err != nil {
				d.log.Warn("cannot sweep a lease's interrupted writes", "lease", l.ID, "err", err)
			} else if n > 0 {
				d.log.Info("removed interrupted writes", "lease", l.ID, "count", n)
			}
		}
	}
}

// startImages removes the image layers no restored lease and no listed image holds,
// then pulls, in the background, the listed images the store does not have.
func (d *Daemon) startImages() {
	d.images.GC()
	d.images.PullAll()
}

// sweep removes what a previous run left and the state does not account for.
func (d *Daemon) sweep(ctx context.Context) {
	if res, err := (host{d.rt, d.leases}).Cleanup(ctx); err != nil {
		d.log.Warn("startup sweep incomplete", "err", err)
	} else if n := len(res.Leases) + len(res.Cgroups) + len(res.Workdirs) + len(res.Processes); n > 0 {
		d.log.Info("startup sweep", "leases", res.Leases, "cgroups", res.Cgroups, "workdirs", res.Workdirs, "processes", res.Processes)
	}
}

// serve builds the HTTP server on the parts, binds the listener and serves in the
// background, beside the lease reaper and the zombie reaper.
func (d *Daemon) serve(ctx context.Context) error {
	cfg, log := d.cfg, d.log
	opts := sidecar.ServerOptions{
		Logger:         log,
		Version:        cfg.Version,
		SharedTokens:   []string{cfg.SharedToken, cfg.PreviousToken},
		Tokens:         d.tokens,
		Leases:         d.leases,
		Processes:      d.procs,
		Shells:         d.shells,
		Files:          d.rt,
		Host:           host{d.rt, d.leases},
		LeaseMetrics:   d.leaseMetrics,
		AllowedOrigins: cfg.AllowedOrigins,
		Console:        cfg.Console,
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
			Capabilities:  apitype.Capabilities{DiskQuota: d.disk.Mode()},
			Network:       d.network.info,
			DefaultLimits: apiLimits(cfg.DefaultLimits),
			DefaultTTL:    int64(cfg.DefaultTTL.Seconds()),
		},
	}
	opts.CapacityMemoryBytes = capacityMemory(cfg.CapacityMemoryBytes)
	if d.scripts != nil { // a nil *script.Runner in the interface would read as enabled
		opts.Scripts = d.scripts
	}
	if d.network.manager != nil {
		opts.Network = d.network.manager
	}
	opts.Images = imageAPI{store: d.images, rt: d.rt, leases: d.leases, defaultImage: d.defaultImage, root: d.rootImages}
	srv := sidecar.NewServer(opts)
	if err := srv.Listen(cfg.ListenAddr, cfg.TLS); err != nil {
		return listenError(cfg.ListenAddr, err)
	}
	warnCertMismatch(d.log, cfg.ListenAddr, cfg.TLS)
	d.srv = srv
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = cancel
	d.wg.Add(5)
	go func() { defer d.wg.Done(); d.serveErr <- srv.Serve() }()
	go func() { defer d.wg.Done(); srv.RunUsageSampler(runCtx) }()
	go func() { defer d.wg.Done(); d.leases.Run(runCtx, cfg.ReapInterval) }()
	go func() { defer d.wg.Done(); d.pruneLeftovers(runCtx, cfg.ReapInterval) }()
	// Orphaned lease processes are reparented to us (subreaper); reap their zombies so
	// they never count against a lease's pids limit.
	go func() { defer d.wg.Done(); confine.RunReaper(runCtx, log.With("component", "reaper")) }()
	caps := d.sandbox.Caps()
	log.Info("sidecar serving", "addr", srv.Addr().String(), "version", cfg.Version, "isolation", caps.Isolation,
		"cgroups", caps.Cgroups, "landlock_abi", caps.LandlockABI, "layers", strings.Join(caps.Layers, ","), "seccomp", caps.Seccomp, "disk_quota", d.disk.Mode())
	for _, gap := range caps.Gaps() {
		log.Warn("isolation layer missing on this kernel", "landlock_abi", caps.LandlockABI, "gap", gap)
	}
	return nil
}

// pruneLeftovers removes, every interval, the child cgroups of finished commands whose
// leftover processes have all exited (a lease's own inspection and commands prune it
// too; this covers the leases nobody looks at).
func (d *Daemon) pruneLeftovers(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.sandbox.PruneLeftovers()
		}
	}
}

// Addr is where the daemon listens.
func (d *Daemon) Addr() net.Addr { return d.srv.Addr() }

// SetDraining starts or ends a drain (SIGUSR1, SIGUSR2); see sidecar.Server.SetDraining.
func (d *Daemon) SetDraining(on bool) bool { return d.srv.SetDraining(on) }

// Done reports a fatal serve error (or nil after Close).
func (d *Daemon) Done() <-chan error { return d.serveErr }

// Close shuts down what was opened: stop accepting, give in-flight requests the shutdown
// deadline, stop the reapers and the script workers, and persist state. Lease processes
// keep running: leases survive a restart, and a later daemon reports processes it lost.
func (d *Daemon) Close(ctx context.Context) error {
	var err error
	d.once.Do(func() {
		sctx, cancel := context.WithTimeout(ctx, d.cfg.HTTP.ShutdownTimeout)
		defer cancel()
		srv := d.srv
		if srv != nil {
			err = srv.Shutdown(sctx)
		}
		d.cancel()
		d.wg.Wait()
		if d.leases != nil {
			err = errors.Join(err, d.leases.DropSpares(sctx)) // not leases yet: nothing keeps them
		}
		if d.procs != nil {
			d.procs.Shutdown(sctx)
		}
		if d.network.manager != nil {
			d.network.manager.Close()
		}
		if d.sandbox != nil {
			err = errors.Join(err, d.sandbox.Close()) // background cgroup work, spare cgroups
		}
		if d.helperNS != nil {
			d.helperNS.Close()
		}
		if d.scripts != nil {
			_ = d.scripts.Close()
		}
		if d.images != nil {
			d.images.Close() // stops the pulls; their partial unpacks go at the next start
		}
		if d.leases != nil {
			err = errors.Join(err, d.leases.Close())
		}
		if d.disk != nil {
			err = errors.Join(err, d.disk.Close()) // mounts stay: leases survive a restart
		}
		if d.mountRoots != nil {
			err = errors.Join(err, d.mountRoots.Close()) // unbound once no lease is left under them
		}
		if srv != nil {
			d.log.Info("sidecar stopped")
		}
	})
	return err
}

// traversable lets lease uids walk down to their workdirs (and list nothing on the
// way): the work root and, when it lies inside the state dir, the state dir become 0711
// (every file in the state dir is 0600 or in a 0700 directory). Any other ancestor that
// others cannot traverse is a configuration error, reported now rather than as a
// baffling "permission denied" inside every lease.
// outsideTmp refuses a state dir or work root under /tmp when leases are isolated: every
// lease process gets its own /tmp mounted over the host's, which would hide its workdir and
// what the daemon binds in from the state dir (its /etc/passwd, its PTYs). It runs before
// anything is made, so a refused start leaves nothing behind.
func outsideTmp(cfg Config) error {
	if cfg.Isolation == "none" {
		return nil
	}
	for _, d := range []struct{ name, path, setting string }{
		{"state dir", cfg.StateDir, "SIDECAR_STATE_DIR"},
		{"work root", cfg.WorkRoot, "SIDECAR_WORK_ROOT (or SIDECAR_STATE_DIR)"},
	} {
		if abs, _ := filepath.Abs(d.path); abs == "/tmp" || strings.HasPrefix(abs, "/tmp/") {
			return fmt.Errorf("%s %s is under /tmp, which each lease's private /tmp hides: set %s elsewhere, e.g. /var/lib/sidecar", d.name, abs, d.setting)
		}
	}
	return nil
}

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
