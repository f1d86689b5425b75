package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Release tears a lease down (Provisioner.Teardown, then its directory) and forgets it.
// Unknown, already released or being released: ErrNotFound. If teardown fails the lease
// stays, so a retry (or the reaper, once it expires) tries again.
func (m *Manager) Release(ctx context.Context, id string) error {
	_, err := m.release(ctx, id, EventReleased)
	return err
}

// Reap releases every lease past its expiry and returns those it released. A lease whose
// teardown fails stays for the next Reap; the errors are joined.
func (m *Manager) Reap(ctx context.Context) ([]Lease, error) {
	m.mu.RLock()
	now := m.cfg.Now()
	var ids []string
	for id, e := range m.leases {
		if e.state == stateLive && !e.lease.Active(now) {
			ids = append(ids, id)
		}
	}
	m.mu.RUnlock()

	var reaped []Lease
	var errs []error
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		l, err := m.release(ctx, id, EventExpired)
		switch {
		case errors.Is(err, ErrNotFound): // released meanwhile by someone else
		case err != nil:
			errs = append(errs, err)
		default:
			reaped = append(reaped, l)
		}
	}
	return reaped, errors.Join(errs...)
}

// release does Release and expiry. Marking the entry stateReleasing under the lock makes the
// caller its only releaser: a racing Release or Reap gets ErrNotFound.
func (m *Manager) release(ctx context.Context, id, kind string) (Lease, error) {
	m.mu.Lock()
	e := m.leases[id]
	if e == nil || e.state != stateLive {
		m.mu.Unlock()
		return Lease{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if kind == EventExpired && e.lease.Active(m.cfg.Now()) {
		m.mu.Unlock() // renewed since Reap looked: not ours to expire
		return Lease{}, fmt.Errorf("%w: %s is active again", ErrNotFound, id)
	}
	e.state = stateReleasing
	l := e.snapshot()
	if m.sessions[l.SessionID] == e {
		delete(m.sessions, l.SessionID)
	}
	m.mu.Unlock()

	if err := m.teardown(ctx, l); err != nil {
		m.mu.Lock()
		e.state = stateLive
		if m.sessions[l.SessionID] == nil && e.lease.Active(m.cfg.Now()) {
			m.sessions[l.SessionID] = e
		}
		m.mu.Unlock()
		m.log.Error("lease teardown failed", "lease", id, "session", l.SessionID, "err", err)
		return Lease{}, fmt.Errorf("lease %s: teardown: %w", id, err)
	}

	m.mu.Lock()
	delete(m.leases, id)
	m.uids.free(l.UID) // only now: its processes are gone
	m.mu.Unlock()
	err := m.persistLease(id)
	m.emit(kind, l)
	// The lease is gone either way; a failed write is still the caller's to know.
	return l, err
}

// teardown undoes what Provision did (the lease's processes are dead after it), detaches
// the lease's filesystem, then removes the lease directory. The directory stays if
// teardown fails: processes of the lease may still be using it.
func (m *Manager) teardown(ctx context.Context, l Lease) error {
	if p := m.cfg.Provisioner; p != nil {
		if err := p.Teardown(ctx, l); err != nil {
			return err
		}
	}
	return m.dropDir(ctx, l.Dir)
}

// Run reaps expired leases and writes recorded activity every interval until ctx ends
// (interval <= 0: every 30 seconds). Errors are logged: the next round tries again.
func (m *Manager) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = 30 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := m.Reap(ctx); err != nil && ctx.Err() == nil {
			m.log.Error("reap failed", "err", err)
		}
		if err := m.flush(); err != nil {
			m.log.Error("persist lease activity failed", "err", err)
		}
	}
}
