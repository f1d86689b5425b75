package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// entryState is where an entry is in its life. Only live entries are visible to Get, List,
// Renew, Release and Reap; the others belong to the one goroutine creating or releasing them.
type entryState int

const (
	stateCreating  entryState = iota // provisioned, being persisted
	stateLive                        // visible, active or expired
	stateReleasing                   // being torn down, by exactly one goroutine
)

type entry struct {
	lease Lease // guarded by Manager.mu, except LastActivityAt which lives in lastActivity
	state entryState
	// lastActivity is unix nanoseconds, stored atomically so Touch needs only a read lock.
	lastActivity atomic.Int64
}

func newEntry(l Lease, s entryState) *entry {
	e := &entry{lease: l, state: s}
	e.lastActivity.Store(l.LastActivityAt.UnixNano())
	return e
}

func (e *entry) snapshot() Lease {
	l := e.lease.clone()
	l.LastActivityAt = time.Unix(0, e.lastActivity.Load())
	return l
}

// creation marks a session whose lease is being created, so that a concurrent Acquire for
// the same session waits for it instead of creating a second lease.
type creation struct {
	id   string
	done chan struct{}
}

// Manager owns the leases of one daemon. It is safe for concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger

	mu       sync.RWMutex
	leases   map[string]*entry    // by lease id, every state
	sessions map[string]*entry    // by session id: the newest live lease of the session
	creating map[string]*creation // by session id
	uids     uidPool
	uidClaim *uidClaim // this daemon's hold on its uid range; nil without one
	// retiring holds released leases whose filesystem and directory are still being
	// removed (or whose removal failed, for the next Run to retry): their ids stay owned
	// and their uids taken until the directory is gone.
	retiring map[string]*retiree
	retired  chan struct{} // closed, and replaced, when a retire goroutine ends; guarded by mu
	// spares are leases made ahead for the default request (spare.go); making are the ids
	// of those being made. spareWake asks keepSpares to look again.
	spares    []Lease
	making    []string
	spareWake chan struct{}
	// lastTurnover is when the last Acquire or Release came (unix nanoseconds of
	// Config.Now): a spare waits for a pause in those too (refillAfterTake).
	lastTurnover atomic.Int64

	persistMu sync.Mutex  // serialises state writes; taken before mu, never inside it
	journal   *journal    // guarded by persistMu
	dirty     atomic.Bool // Touch changed something not yet written
}

// Open loads the state in cfg.StateDir, provisions every active lease again (Provision is
// idempotent) and returns the Manager. A lease whose re-provisioning fails is logged and
// marked expired, so the next Reap tears it down instead of the daemon refusing to start.
// Leases that expired while the daemon was down are left for the first Reap.
func Open(ctx context.Context, cfg Config) (*Manager, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("lease: state dir: %w", err)
	}
	if err := os.MkdirAll(cfg.WorkRoot, 0o711); err != nil {
		return nil, fmt.Errorf("lease: work root: %w", err)
	}
	claim, err := claimUIDRange(cfg.UIDOwners, cfg.StateDir, cfg.UIDFirst, cfg.UIDLast)
	if err != nil {
		return nil, err
	}
	now := cfg.Now()
	jr, leases, err := openJournal(cfg.StateDir, cfg.WorkRoot, now, cfg.Logger.Warn)
	if err != nil {
		claim.close()
		return nil, err
	}
	m := &Manager{
		cfg:       cfg,
		log:       cfg.Logger,
		journal:   jr,
		leases:    make(map[string]*entry, len(leases)),
		sessions:  map[string]*entry{},
		creating:  map[string]*creation{},
		retiring:  map[string]*retiree{},
		retired:   make(chan struct{}),
		spareWake: make(chan struct{}, 1),
		uids:      newUIDPool(cfg.UIDFirst, cfg.UIDLast),
		uidClaim:  claim,
	}
	slices.SortFunc(leases, byCreation)
	for _, l := range leases {
		e := newEntry(l, stateLive)
		m.leases[l.ID] = e
		m.uids.mark(l.UID)
		if l.Active(now) {
			m.sessions[l.SessionID] = e // sorted by creation: the newest wins
		}
	}
	for _, l := range leases {
		if !l.Active(now) {
			continue
		}
		if err := m.restore(ctx, l); err != nil {
			m.log.Error("lease restore failed; expiring it", "lease", l.ID, "session", l.SessionID, "err", err)
			m.leases[l.ID].lease.ExpiresAt = now
			if err := m.persistLease(l.ID); err != nil {
				jr.close()
				claim.close()
				return nil, err
			}
		}
	}
	m.log.Info("leases loaded", "leases", len(leases), "state_dir", cfg.StateDir)
	return m, nil
}

// restore brings back the directories and provisioning of a lease after a restart.
func (m *Manager) restore(ctx context.Context, l Lease) error {
	if d := m.cfg.Disk; d != nil {
		// A directory removed by a release whose save failed comes back whole: a fresh
		// filesystem on a new directory, as ensureDirs would make it without one.
		if err := os.Mkdir(l.Dir, dirMode); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := d.Attach(ctx, l.Dir, l.Limits.DiskBytes); err != nil {
			return err
		}
	}
	if err := ensureDirs(l); err != nil {
		return err
	}
	if p := m.cfg.Provisioner; p != nil {
		return p.Provision(ctx, l)
	}
	return nil
}

// Get returns the lease with that id: ErrNotFound if there is none (or it is being
// released), and the lease with ErrExpired if it is past its expiry but not yet reaped.
func (m *Manager) Get(id string) (Lease, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	e := m.leases[id]
	if e == nil || e.state != stateLive {
		return Lease{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	l := e.snapshot()
	if !l.Active(m.cfg.Now()) {
		return l, fmt.Errorf("%w: %s expired at %s", ErrExpired, id, l.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return l, nil
}

// List returns every lease not yet released, expired ones included, oldest first.
func (m *Manager) List() []Lease {
	m.mu.RLock()
	out := make([]Lease, 0, len(m.leases))
	for _, e := range m.leases {
		if e.state == stateLive {
			out = append(out, e.snapshot())
		}
	}
	m.mu.RUnlock()
	slices.SortFunc(out, byCreation)
	return out
}

func byCreation(a, b Lease) int {
	if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
		return c
	}
	return cmp.Compare(a.ID, b.ID)
}

// Touch records activity on a lease. It is cheap (a read lock and an atomic store) and is
// persisted lazily: by the next state change, by Run, or by Close.
func (m *Manager) Touch(id string) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if e := m.leases[id]; e != nil && e.state == stateLive {
		e.lastActivity.Store(m.cfg.Now().UnixNano())
		if !m.dirty.Load() { // a load keeps the shared cache line clean on the hot path
			m.dirty.Store(true)
		}
	}
}

// Renew moves the expiry of an active lease to now+ttl (ttl 0: the default TTL). An expired
// lease cannot be renewed: ErrExpired.
func (m *Manager) Renew(ctx context.Context, id string, ttl time.Duration) (Lease, error) {
	ttl, err := m.cfg.ttl(ttl)
	if err != nil {
		return Lease{}, err
	}
	m.mu.Lock()
	e := m.leases[id]
	if e == nil || e.state != stateLive {
		m.mu.Unlock()
		return Lease{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	now := m.cfg.Now()
	if !e.lease.Active(now) {
		l := e.snapshot()
		m.mu.Unlock()
		return l, fmt.Errorf("%w: %s cannot be renewed", ErrExpired, id)
	}
	old := e.lease.ExpiresAt
	e.lease.ExpiresAt = now.Add(ttl)
	e.lastActivity.Store(now.UnixNano())
	l := e.snapshot()
	m.mu.Unlock()

	if err := m.persistLease(id); err != nil {
		// Undo, so the caller's failure matches what a restart would find.
		m.mu.Lock()
		if e.lease.ExpiresAt.Equal(l.ExpiresAt) {
			e.lease.ExpiresAt = old
		}
		m.mu.Unlock()
		return Lease{}, err
	}
	m.emit(EventRenewed, l)
	return l, nil
}

// Close waits for released leases' directories being removed, writes the state one last
// time (for activity recorded by Touch), compacted, and gives up the uid range. A Manager
// used after Close keeps working: the journal reopens on the next write.
func (m *Manager) Close() error {
	_ = m.waitRetired(context.Background())
	m.persistMu.Lock()
	defer m.persistMu.Unlock()
	err := m.compactLocked()
	m.journal.close()
	m.uidClaim.close()
	m.uidClaim = nil
	return err
}

// flush compacts the journal if Touch recorded activity since the last write, or the
// journal holds many records more than the table: off the request path, in Run.
func (m *Manager) flush() error {
	m.persistMu.Lock()
	defer m.persistMu.Unlock()
	m.mu.RLock()
	n := len(m.leases)
	m.mu.RUnlock()
	if !m.dirty.Load() && m.journal.records <= 2*n+64 && !m.journal.broken {
		return nil
	}
	return m.compactLocked()
}

// persistLease records the lease with that id as it is now: a put while it is in the
// table, a del once it is gone. One appended, fsynced record whatever the number of
// leases. Writers take persistMu before reading the entry, so the last record of a lease
// always holds its newest state.
func (m *Manager) persistLease(id string) error {
	m.persistMu.Lock()
	defer m.persistMu.Unlock()
	return m.persistLeaseLocked(id)
}

// compactions returns how many times the journal has been compacted.
func (m *Manager) compactions() int {
	m.persistMu.Lock()
	defer m.persistMu.Unlock()
	return m.journal.compactions
}

func (m *Manager) persistLeaseLocked(id string) error {
	if m.journal.broken {
		return m.compactLocked() // the table as it is now holds this change too
	}
	m.mu.RLock()
	e := m.leases[id]
	var rec journalRecord
	if e != nil {
		s := toStored(e.snapshot())
		rec.Put = &s
	} else {
		rec.Del = id
	}
	n := len(m.leases)
	m.mu.RUnlock()
	if err := m.journal.appendRecords(rec); err != nil {
		return fmt.Errorf("lease: save state: %w", err)
	}
	if m.journal.compactDue(n) { // Run compacts long before; this bounds the file without it
		if err := m.compactLocked(); err != nil {
			m.log.Warn("lease journal compaction failed; appending on", "err", err)
		}
	}
	return nil
}

// compactLocked rewrites the journal as one record per lease. Call with persistMu held.
func (m *Manager) compactLocked() error {
	m.dirty.Store(false)
	m.mu.RLock()
	leases := make([]Lease, 0, len(m.leases))
	for _, e := range m.leases {
		leases = append(leases, e.snapshot())
	}
	m.mu.RUnlock()
	slices.SortFunc(leases, byCreation)
	if err := m.journal.compact(leases); err != nil {
		m.dirty.Store(true)
		return err
	}
	return nil
}

// emit logs the audit line and calls the event hook. Never log a token or a secret here.
func (m *Manager) emit(kind string, l Lease) {
	m.log.Info("lease "+kind, "lease", l.ID, "session", l.SessionID, "uid", l.UID,
		"expires_at", l.ExpiresAt.UTC().Format(time.RFC3339))
	m.cfg.OnEvent(Event{Kind: kind, Lease: l})
}
