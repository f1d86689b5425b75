package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Release tears a lease down (Provisioner.Teardown: its processes are killed when it
// returns) and forgets it; the rest (Provisioner.Retire) and its directory are removed
// right after, off the caller's path (retire).
// Unknown, already released or being released: ErrNotFound. If teardown fails the lease
// stays, so a retry (or the reaper, once it expires) tries again.
func (m *Manager) Release(ctx context.Context, id string) error {
	m.noteTurnover()
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

	if p := m.cfg.Provisioner; p != nil {
		if err := p.Teardown(ctx, l); err != nil {
			m.mu.Lock()
			e.state = stateLive
			if m.sessions[l.SessionID] == nil && e.lease.Active(m.cfg.Now()) {
				m.sessions[l.SessionID] = e
			}
			m.mu.Unlock()
			m.log.Error("lease teardown failed", "lease", id, "session", l.SessionID, "err", err)
			return Lease{}, fmt.Errorf("lease %s: teardown: %w", id, err)
		}
	}

	r := &retiree{lease: l, running: true}
	m.mu.Lock()
	delete(m.leases, id)
	m.retiring[id] = r
	m.mu.Unlock()
	err := m.persistLease(id)
	m.emit(kind, l)
	m.retire(r)
	// The lease is gone either way; a failed write is still the caller's to know.
	return l, err
}

// retiree is a released lease whose remains (Provisioner.Retire), filesystem and directory
// are being removed.
type retiree struct {
	lease   Lease
	running bool  // a retire goroutine has it; guarded by Manager.mu
	err     error // why its last removal failed; guarded by Manager.mu
}

// retire removes a released lease's remains (Provisioner.Retire), detaches its filesystem
// and removes its directory in the background: the lease's processes are killed and the
// journal says it is gone (a crash now leaves orphans that the startup sweeps remove). Its uid is handed out again only once
// the directory is gone, so a new lease never finds files of its uid's previous owner. A
// removal that fails is logged and tried again by Run.
func (m *Manager) retire(r *retiree) {
	go func() {
		err := m.dropLease(context.Background(), r.lease)
		m.mu.Lock()
		r.running, r.err = false, err
		if err == nil {
			delete(m.retiring, r.lease.ID)
			m.uids.free(r.lease.UID)
		}
		close(m.retired)
		m.retired = make(chan struct{})
		m.mu.Unlock()
		if err != nil {
			m.log.Error("released lease's directory not removed; retrying later", "lease", r.lease.ID, "dir", r.lease.Dir, "err", err)
		}
	}()
}

// retryRetires starts again the removals that failed.
func (m *Manager) retryRetires() {
	m.mu.Lock()
	var again []*retiree
	for _, r := range m.retiring {
		if !r.running {
			r.running = true
			again = append(again, r)
		}
	}
	m.mu.Unlock()
	for _, r := range again {
		m.retire(r)
	}
}

// Retiring is how many released leases still have a directory: being removed, or waiting
// for Run's retry after a failed removal. Their uids are not handed out meanwhile.
func (m *Manager) Retiring() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.retiring)
}

// waitRetired waits, until ctx ends, for no released lease's directory to be being removed:
// each is gone, or its removal failed and waits for Run's retry.
func (m *Manager) waitRetired(ctx context.Context) error {
	for {
		m.mu.RLock()
		running, ended := m.retiringLocked(), m.retired
		m.mu.RUnlock()
		if !running {
			return nil
		}
		select {
		case <-ended:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// retiringLocked reports whether a retire goroutine is running. Call with mu held.
func (m *Manager) retiringLocked() bool {
	for _, r := range m.retiring {
		if r.running {
			return true
		}
	}
	return false
}

// Run reaps expired leases, retries failed directory removals, keeps the spares
// (spare.go) and writes recorded activity every interval until ctx ends (interval <= 0:
// every 30 seconds). Errors are logged: the next round tries again.
func (m *Manager) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = 30 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	spares := make(chan struct{})
	go func() { defer close(spares); m.keepSpares(ctx) }()
	defer func() { <-spares }()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := m.Reap(ctx); err != nil && ctx.Err() == nil {
			m.log.Error("reap failed", "err", err)
		}
		m.retryRetires()
		m.wakeSpares()
		if err := m.flush(); err != nil {
			m.log.Error("persist lease activity failed", "err", err)
		}
	}
}
