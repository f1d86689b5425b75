package fsxfer

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Budgets are what all the leases of a daemon share of the host: searches (how many
// run at once and the memory they hold) and the inotify instances and watches that
// watches take from the daemon's user, root. One Budgets serves every FS of a daemon
// (Config.Budgets); each FS also keeps its own share below it (MaxSearchesPerLease,
// LeaseInotify).
type Budgets struct {
	cfg BudgetConfig

	searches   atomic.Int64 // running, daemon-wide
	searchFree atomic.Int64 // bytes of SearchBytes not held

	inotifyMu        sync.Mutex
	inotifyInstances int // held, daemon-wide
	inotifyWatches   int
}

// BudgetConfig sizes Budgets. Zero values take the defaults.
type BudgetConfig struct {
	// MaxSearches bounds the searches running at once, daemon-wide. Default 16.
	MaxSearches int
	// SearchBytes bounds the memory searches hold at once, daemon-wide: their compiled
	// patterns, the files they hold in memory beyond a small pooled buffer, and their
	// results until the reply is written. Default 256 MiB.
	SearchBytes int64
	// InotifyInstances and InotifyWatches bound the inotify instances and watches all
	// watches hold, daemon-wide. Default: InotifyShare of the host's limits.
	InotifyInstances, InotifyWatches int
}

// Defaults of BudgetConfig, and each lease's share.
const (
	DefaultMaxSearches      = 16
	DefaultSearchBudget     = 256 << 20
	MaxSearchesPerLease     = 4
	DefaultInotifyInstances = 128  // the kernel's default max_user_instances, when it cannot be read
	DefaultInotifyWatches   = 8192 // the smallest max_user_watches a kernel defaults to
	// InotifyShare is the fraction of the host's per-user inotify limits the daemon takes
	// for all its leases (a quarter): root keeps three quarters, and two daemons on one
	// host still leave it half.
	InotifyShare = 4
	// LeaseInotifyShare is the fraction of the daemon's inotify budget one lease may hold
	// (a quarter), below MaxWatchesPerFS instances and MaxWatchDirs watches.
	LeaseInotifyShare = 4
)

// ErrSearchLimit: a search refused because the lease or the daemon already runs as many
// searches as it may, or their memory budget is spent (a 429, search_limit).
var ErrSearchLimit = errors.New("search limit")

// ErrPatternTooComplex: a grep pattern whose compiled program is over MaxGrepProgram
// instructions (a 400, pattern_too_complex).
var ErrPatternTooComplex = errors.New("pattern too complex")

// ErrWatchLimit: a watch refused because the lease or the daemon holds all the inotify
// instances or watches its budget allows, or the host refused one (a 429, watch_limit).
var ErrWatchLimit = errors.New("watch limit")

// NewBudgets returns budgets sized by cfg; the inotify budget defaults to a quarter of
// the host's limits, read from /proc/sys/fs/inotify.
func NewBudgets(cfg BudgetConfig) (*Budgets, error) {
	if cfg.MaxSearches < 0 || cfg.SearchBytes < 0 || cfg.InotifyInstances < 0 || cfg.InotifyWatches < 0 {
		return nil, fmt.Errorf("fsxfer: %w: negative budget", ErrInvalid)
	}
	if cfg.MaxSearches == 0 {
		cfg.MaxSearches = DefaultMaxSearches
	}
	if cfg.SearchBytes == 0 {
		cfg.SearchBytes = DefaultSearchBudget
	}
	if cfg.InotifyInstances == 0 || cfg.InotifyWatches == 0 {
		inst, watches := HostInotifyLimits()
		if cfg.InotifyInstances == 0 {
			cfg.InotifyInstances = max(1, inst/InotifyShare)
		}
		if cfg.InotifyWatches == 0 {
			cfg.InotifyWatches = max(1, watches/InotifyShare)
		}
	}
	b := &Budgets{cfg: cfg}
	b.searchFree.Store(cfg.SearchBytes)
	return b, nil
}

// Config returns the budgets' sizes, defaults filled in.
func (b *Budgets) Config() BudgetConfig { return b.cfg }

// LeaseInotify is one lease's share of the inotify budget: instances (each watch is one)
// and watches (one per directory watched).
func (b *Budgets) LeaseInotify() (instances, watches int) {
	return max(1, min(MaxWatchesPerFS, b.cfg.InotifyInstances/LeaseInotifyShare)),
		max(1, min(MaxWatchDirs, b.cfg.InotifyWatches/LeaseInotifyShare))
}

// HostInotifyLimits reads the host's per-user inotify limits (max_user_instances,
// max_user_watches), or the kernel's smallest defaults when they cannot be read.
func HostInotifyLimits() (instances, watches int) {
	read := func(name string, def int) int {
		b, err := os.ReadFile("/proc/sys/fs/inotify/" + name)
		if err != nil {
			return def
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || n <= 0 {
			return def
		}
		return n
	}
	return read("max_user_instances", DefaultInotifyInstances), read("max_user_watches", DefaultInotifyWatches)
}

var (
	defaultBudgetsOnce sync.Once
	defaultBudgets     *Budgets
)

// processBudgets is the Budgets of an FS opened without any: one per process, so that
// no FS is ever unbounded.
func processBudgets() *Budgets {
	defaultBudgetsOnce.Do(func() { defaultBudgets, _ = NewBudgets(BudgetConfig{}) })
	return defaultBudgets
}

// takeBytes grants n bytes of the search budget, all or nothing.
func (b *Budgets) takeBytes(n int64) bool {
	for {
		free := b.searchFree.Load()
		if n > free {
			return false
		}
		if b.searchFree.CompareAndSwap(free, free-n) {
			return true
		}
	}
}

func (b *Budgets) giveBytes(n int64) { b.searchFree.Add(n) }

// searchHold is what one search holds of the lease's and the daemon's budgets, from
// admission until its reply is written (Release).
type searchHold struct {
	f        *FS
	bytes    atomic.Int64
	released atomic.Bool
}

// admitSearch takes a search slot of the lease and of the daemon.
func (f *FS) admitSearch() (*searchHold, error) {
	b := f.budgets
	if f.searches.Add(1) > MaxSearchesPerLease {
		f.searches.Add(-1)
		return nil, fmt.Errorf("%w: the lease runs %d searches at once already, the most it may; retry when one has answered",
			ErrSearchLimit, MaxSearchesPerLease)
	}
	if b.searches.Add(1) > int64(b.cfg.MaxSearches) {
		b.searches.Add(-1)
		f.searches.Add(-1)
		return nil, fmt.Errorf("%w: the daemon runs %d searches at once already, the most it may (SIDECAR_MAX_SEARCHES); retry shortly",
			ErrSearchLimit, b.cfg.MaxSearches)
	}
	return &searchHold{f: f}, nil
}

// take charges n bytes to the daemon's search budget; false when it is spent.
func (h *searchHold) take(n int64) bool {
	if !h.f.budgets.takeBytes(n) {
		return false
	}
	h.bytes.Add(n)
	return true
}

func (h *searchHold) give(n int64) {
	h.bytes.Add(-n)
	h.f.budgets.giveBytes(n)
}

// release gives everything back; it may be called more than once.
func (h *searchHold) release() {
	if h == nil || h.released.Swap(true) {
		return
	}
	h.f.budgets.giveBytes(h.bytes.Swap(0))
	h.f.budgets.searches.Add(-1)
	h.f.searches.Add(-1)
}

// takeInotify charges one inotify instance (instance) or n watches to the lease's and
// the daemon's budgets, all or nothing.
func (f *FS) takeInotify(instance bool, n int) error {
	b := f.budgets
	leaseInst, leaseWatches := b.LeaseInotify()
	b.inotifyMu.Lock()
	defer b.inotifyMu.Unlock()
	if instance {
		switch {
		case f.inotifyInstances+1 > leaseInst:
			return fmt.Errorf("%w: the lease holds %d watches, the most it may", ErrWatchLimit, leaseInst)
		case b.inotifyInstances+1 > b.cfg.InotifyInstances:
			return fmt.Errorf("%w: the daemon's leases hold the %d inotify instances it may take of the host's (a quarter of fs.inotify.max_user_instances); retry when a watch has ended",
				ErrWatchLimit, b.cfg.InotifyInstances)
		}
		f.inotifyInstances++
		b.inotifyInstances++
		return nil
	}
	switch {
	case f.inotifyWatches+n > leaseWatches:
		return fmt.Errorf("%w: the lease's watches hold %d of the %d directories it may watch at once", ErrWatchLimit, f.inotifyWatches, leaseWatches)
	case b.inotifyWatches+n > b.cfg.InotifyWatches:
		return fmt.Errorf("%w: the daemon's leases hold the %d inotify watches it may take of the host's (a quarter of fs.inotify.max_user_watches); retry when a watch has ended",
			ErrWatchLimit, b.cfg.InotifyWatches)
	}
	f.inotifyWatches += n
	b.inotifyWatches += n
	return nil
}

// giveInotify returns what takeInotify charged.
func (f *FS) giveInotify(instances, watches int) {
	b := f.budgets
	b.inotifyMu.Lock()
	defer b.inotifyMu.Unlock()
	f.inotifyInstances -= instances
	b.inotifyInstances -= instances
	f.inotifyWatches -= watches
	b.inotifyWatches -= watches
}
