package fsxfer

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// Config describes one lease's file area.
type Config struct {
	Workdir string // the lease workdir: every path is resolved inside it through an os.Root
	// Mount is the absolute name lease processes know the workdir by ("/workspace"): a
	// path may be relative or absolute under it. "": relative paths only.
	Mount      string
	UploadsDir string // partial resumable uploads live here, outside the visible tree; "": uploads disabled
	UsageRoot  string // what counts against the quota (the lease dir holding work/, tmp/, uploads/); "": Workdir
	UID, GID   int    // owner of everything written; -1: leave as the daemon
	QuotaBytes int64  // 0: unlimited

	MaxArchiveEntries int           // default 200_000
	MaxNameBytes      int           // longest path, default 4096; one name is at most 255 bytes (NAME_MAX)
	MaxListEntries    int           // longest directory listing, default 100_000
	UploadIdle        time.Duration // partial uploads idle longer are reaped by ReapUploads; default 24h
	UsageTTL          time.Duration // how long a usage scan is reused; default 2s
	// Budgets are the daemon-wide bounds on searches and watches that every FS of the
	// daemon shares; nil: one per process.
	Budgets *Budgets
	Now     func() time.Time
	Logger  *slog.Logger // default: discard
}

// Defaults for the zero values of Config.
const (
	DefaultMaxArchiveEntries = 200_000
	DefaultMaxNameBytes      = 4096
	DefaultMaxListEntries    = 100_000
	DefaultUploadIdle        = 24 * time.Hour
	DefaultUsageTTL          = 2 * time.Second
	maxNameElem              = 255 // NAME_MAX on every Linux filesystem we care about
)

// FS is one lease's confined file area. Its methods are safe for concurrent use.
type FS struct {
	cfg      Config
	root     *os.Root // the workdir
	uploads  *os.Root // nil when resumable uploads are disabled
	meter    *meter
	log      *slog.Logger
	leaseUID int // the uid a hard-linked file must belong to before it is served or replaced
	watchers watcherSet
	mnt      uint64 // mount ID of the workdir: Find, Grep and Watch stay on it
	budgets  *Budgets
	searches atomic.Int64 // searches running (until their reply is written)
	// inotify instances and watches the lease's watches hold, guarded by budgets.inotifyMu
	inotifyInstances, inotifyWatches int
}

// Open opens the lease file area described by cfg. The workdir must exist; the uploads
// directory is created (mode 0700, owned by the daemon) when missing.
func Open(cfg Config) (*FS, error) {
	if !filepath.IsAbs(cfg.Workdir) {
		return nil, fmt.Errorf("fsxfer: workdir %q: %w: want an absolute path", cfg.Workdir, ErrInvalid)
	}
	if cfg.Mount != "" && (!filepath.IsAbs(cfg.Mount) || filepath.Clean(cfg.Mount) != cfg.Mount || cfg.Mount == "/") {
		return nil, fmt.Errorf("fsxfer: mount %q: %w: want an absolute clean path other than /", cfg.Mount, ErrInvalid)
	}
	if cfg.UsageRoot == "" {
		cfg.UsageRoot = cfg.Workdir
	}
	if cfg.MaxArchiveEntries <= 0 {
		cfg.MaxArchiveEntries = DefaultMaxArchiveEntries
	}
	if cfg.MaxNameBytes <= 0 {
		cfg.MaxNameBytes = DefaultMaxNameBytes
	}
	if cfg.MaxListEntries <= 0 {
		cfg.MaxListEntries = DefaultMaxListEntries
	}
	if cfg.UploadIdle <= 0 {
		cfg.UploadIdle = DefaultUploadIdle
	}
	if cfg.UsageTTL <= 0 {
		cfg.UsageTTL = DefaultUsageTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Budgets == nil {
		cfg.Budgets = processBudgets()
	}
	if cfg.QuotaBytes < 0 {
		return nil, fmt.Errorf("fsxfer: quota %d: %w", cfg.QuotaBytes, ErrInvalid)
	}
	root, err := os.OpenRoot(cfg.Workdir)
	if err != nil {
		return nil, fmt.Errorf("fsxfer: open workdir: %w", err)
	}
	f := &FS{
		cfg:      cfg,
		root:     root,
		log:      cfg.Logger,
		leaseUID: cfg.UID,
		budgets:  cfg.Budgets,
		meter:    newMeter(cfg.UsageRoot, cfg.QuotaBytes, cfg.UsageTTL, cfg.Now),
	}
	if f.leaseUID < 0 {
		f.leaseUID = os.Geteuid()
	}
	if d, err := f.openDir("."); err == nil {
		f.mnt = mustMnt(fd(d))
		d.Close()
	}
	if cfg.UploadsDir != "" {
		if err := os.MkdirAll(cfg.UploadsDir, 0o700); err != nil {
			root.Close()
			return nil, fmt.Errorf("fsxfer: uploads dir: %w", err)
		}
		if f.uploads, err = os.OpenRoot(cfg.UploadsDir); err != nil {
			root.Close()
			return nil, fmt.Errorf("fsxfer: uploads dir: %w", err)
		}
	}
	return f, nil
}

// Close ends the watches and releases the descriptors held for the workdir and the
// uploads directory.
func (f *FS) Close() error {
	f.closeWatchers()
	err := f.root.Close()
	if f.uploads != nil {
		err = errors.Join(err, f.uploads.Close())
	}
	return err
}
