package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Acquire returns the active lease of r.SessionID (created false, nothing renewed) or
// creates one: its directories, then Provisioner.Provision, then the state file; or, for a
// request of the default shape, it takes a spare made ahead (spare.go). If any step
// fails, everything done so far is undone and the error returned: no stray lease or
// directory is left. Concurrent calls for one session return the same lease.
func (m *Manager) Acquire(ctx context.Context, r Request) (l Lease, created bool, err error) {
	r, err = m.cfg.normalize(r)
	if err != nil {
		return Lease{}, false, err
	}
	m.noteTurnover()
	reaped, waited := false, false
	for {
		m.mu.Lock()
		now := m.cfg.Now()
		if e := m.sessions[r.SessionID]; e != nil && e.state == stateLive && e.lease.Active(now) {
			l := e.snapshot()
			m.mu.Unlock()
			return l, false, nil
		}
		if c := m.creating[r.SessionID]; c != nil {
			m.mu.Unlock()
			select {
			case <-c.done: // look again: it is live now, or it failed and we try ourselves
				continue
			case <-ctx.Done():
				return Lease{}, false, ctx.Err()
			}
		}
		if m.heldLocked() >= m.cfg.MaxLeases {
			expired := m.anyExpiredLocked()
			m.mu.Unlock()
			if expired && !reaped {
				// Expired leases hold no right to their slot: make room once, then look again.
				reaped = true
				if _, err := m.Reap(ctx); err != nil {
					m.log.Warn("reap before acquire failed", "err", err)
				}
				continue
			}
			return Lease{}, false, fmt.Errorf("%w: %d leases, the maximum", ErrLimit, m.cfg.MaxLeases)
		}
		if spare, ok := m.takeSpareLocked(r); ok {
			c := &creation{id: spare.ID, done: make(chan struct{})}
			m.creating[r.SessionID] = c
			m.mu.Unlock()
			if !m.spareCurrent(spare) {
				// Made on an image since replaced: a lease made now gets the new one.
				m.mu.Lock()
				delete(m.creating, r.SessionID)
				m.discardLocked(spare)
				m.mu.Unlock()
				close(c.done)
				time.AfterFunc(spareAfterTake, m.wakeSpares)
				continue
			}
			l, err := m.adopt(ctx, spare, r)
			close(c.done)
			return l, err == nil, err
		}
		uid, err := m.uids.take()
		if err != nil && m.dropSpareLocked() {
			// A spare holds a uid a lease of another shape needs: it goes, and its uid
			// with its directory (waited for below).
			m.mu.Unlock()
			continue
		}
		if err != nil {
			retiring := m.retiringLocked()
			m.mu.Unlock()
			if retiring && !waited {
				// The uids left are held by released leases until their directories are
				// removed, which takes milliseconds: wait for those once, then look again.
				waited = true
				if err := m.waitRetired(ctx); err != nil {
					return Lease{}, false, err
				}
				continue
			}
			return Lease{}, false, err
		}
		c := &creation{id: newID(), done: make(chan struct{})}
		m.creating[r.SessionID] = c
		m.mu.Unlock()

		l, err := m.create(ctx, c.id, uid, r)
		close(c.done)
		return l, err == nil, err
	}
}

// heldLocked counts the leases holding a slot: those in the table, and creations not in
// it yet (a creation enters the table before it is persisted, and must not count twice
// meanwhile). Call with mu held.
func (m *Manager) heldLocked() int {
	n := len(m.leases)
	for _, c := range m.creating {
		if _, listed := m.leases[c.id]; !listed {
			n++
		}
	}
	return n
}

// anyExpiredLocked reports whether a live lease is past its expiry. Call with mu held.
func (m *Manager) anyExpiredLocked() bool {
	now := m.cfg.Now()
	for _, e := range m.leases {
		if e.state == stateLive && !e.lease.Active(now) {
			return true
		}
	}
	return false
}

// create builds the lease reserved by Acquire: id and uid are taken, and
// m.creating[r.SessionID] is set; create clears it.
func (m *Manager) create(ctx context.Context, id string, uid int, r Request) (Lease, error) {
	l := m.newLease(id, uid, r)
	if err := m.build(ctx, l); err != nil {
		m.forget(l, r.SessionID)
		return Lease{}, err
	}
	return m.enter(ctx, l, r)
}

// newLease is the lease of request r, with its id and uid, created now.
func (m *Manager) newLease(id string, uid int, r Request) Lease {
	now := m.cfg.Now()
	return Lease{
		ID: id, SessionID: r.SessionID, Labels: cloneLabels(r.Labels), Network: r.Network, Image: r.Image,
		Limits: r.Limits, UID: uid, GID: uid, Dir: filepath.Join(m.cfg.WorkRoot, id),
		CreatedAt: now, ExpiresAt: now.Add(r.TTL), LastActivityAt: now,
	}
}

// build makes the lease's directory, filesystem and subdirectories and provisions it. On
// an error whatever it made is undone.
func (m *Manager) build(ctx context.Context, l Lease) error {
	// An existing Dir is not ours to take over, nor to remove on rollback.
	if err := os.Mkdir(l.Dir, dirMode); err != nil {
		return fmt.Errorf("lease: create directory: %w", err)
	}
	if d := m.cfg.Disk; d != nil {
		if err := d.Attach(ctx, l.Dir, l.Limits.DiskBytes); err != nil {
			if rmErr := m.dropDir(ctx, l.Dir); rmErr != nil {
				m.log.Error("lease rollback: remove dir", "lease", l.ID, "err", rmErr)
			}
			return fmt.Errorf("lease: disk: %w", err)
		}
	}
	if err := ensureDirs(l); err != nil {
		if rmErr := m.dropDir(ctx, l.Dir); rmErr != nil {
			m.log.Error("lease rollback: remove dir", "lease", l.ID, "err", rmErr)
		}
		return fmt.Errorf("lease: create directories: %w", err)
	}
	if p := m.cfg.Provisioner; p != nil {
		if err := p.Provision(ctx, l); err != nil {
			m.undo(ctx, l)
			return fmt.Errorf("lease: provision: %w", err)
		}
	}
	return nil
}

// forget gives up a lease that was reserved or built but never became live: its id, the
// session's creation and its uid.
func (m *Manager) forget(l Lease, session string) {
	m.mu.Lock()
	delete(m.leases, l.ID)
	delete(m.creating, session)
	m.uids.free(l.UID)
	m.mu.Unlock()
}

// enter makes a built lease live for session r.SessionID: it enters the table, the journal
// records it, and the session finds it. A failed write undoes the lease.
func (m *Manager) enter(ctx context.Context, l Lease, r Request) (Lease, error) {
	e := newEntry(l, stateCreating)
	m.mu.Lock()
	m.leases[l.ID] = e
	m.mu.Unlock()
	compactions := m.compactions()
	if err := m.persistLease(l.ID); err != nil {
		m.undo(ctx, l)
		m.forget(l, r.SessionID)
		// A compaction meanwhile may have recorded the lease; record that it is gone.
		// Otherwise the journal is as it was: a failed append is cut back.
		if m.compactions() != compactions {
			if err2 := m.persistLease(l.ID); err2 != nil {
				m.log.Error("lease rollback: persist", "lease", l.ID, "err", err2)
			}
		}
		return Lease{}, err
	}
	m.mu.Lock()
	e.state = stateLive
	m.sessions[r.SessionID] = e
	delete(m.creating, r.SessionID)
	m.mu.Unlock()
	m.emit(EventCreated, l.clone())
	return l.clone(), nil
}

// adopt makes a spare the lease of request r: the session's, created now. The next spare
// is made once the daemon is quiet (refillAfterTake).
func (m *Manager) adopt(ctx context.Context, spare Lease, r Request) (Lease, error) {
	l := m.newLease(spare.ID, spare.UID, r)
	defer m.refillAfterTake(l.ID)
	return m.enter(ctx, l, r)
}

// undo tears down a half-made lease. It must finish even if the caller gave up.
func (m *Manager) undo(ctx context.Context, l Lease) {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if p := m.cfg.Provisioner; p != nil {
		errs = append(errs, p.Teardown(ctx, l))
	}
	errs = append(errs, m.dropLease(ctx, l))
	if err := errors.Join(errs...); err != nil {
		m.log.Error("lease rollback incomplete", "lease", l.ID, "session", l.SessionID, "err", err)
	}
}

func cloneLabels(labels map[string]string) map[string]string {
	if len(labels) == 0 {
		return nil
	}
	out := make(map[string]string, len(labels))
	for k, v := range labels {
		out[k] = v
	}
	return out
}
