package lease

import (
	"context"
	"errors"
	"slices"
	"time"
)

// Spare leases take a lease's whole set-up off the acquire path. A spare is made ahead for
// a request of the default shape (default limits, network and image): its directory,
// filesystem and Provisioner.Provision (cgroup, network namespace, its first launcher)
// are done, so an acquire of that shape only gives it a session and journals it. A spare is
// not a lease yet: Get and List do not see it, it holds no slot of MaxLeases, no journal
// records it (a crash leaves an orphan the startup sweep removes) and DropSpares takes it
// down. It does hold a uid: an acquire that finds none free takes a spare down first.
// Spares are kept for leases on the host's root only: an image's content may change
// under its name while a spare waits.

// spareAfterTake is how long after a spare is taken the next one is made: not beside the
// new lease's first commands, which would share the CPUs with its set-up (about what a
// lease's acquire costs).
const spareAfterTake = 250 * time.Millisecond

// spareRequest is the normalized request spares are made for; ok false when the default
// shape runs on an image or no spare is wanted.
func (m *Manager) spareRequest() (Request, bool) {
	if m.cfg.Spares <= 0 {
		return Request{}, false
	}
	r, err := m.cfg.normalize(Request{SessionID: "spare"})
	if err != nil || r.Image != "" {
		return Request{}, false
	}
	return r, true
}

// fitsSpare says whether a normalized request gets what a spare was provisioned with.
func fitsSpare(r, spare Request) bool {
	return r.Image == spare.Image && r.Limits == spare.Limits &&
		r.Network.Egress == spare.Network.Egress &&
		slices.Equal(r.Network.AllowOut, spare.Network.AllowOut) &&
		slices.Equal(r.Network.DenyOut, spare.Network.DenyOut)
}

// takeSpareLocked hands out a spare for r, if there is one that fits. Call with mu held.
func (m *Manager) takeSpareLocked(r Request) (Lease, bool) {
	want, ok := m.spareRequest()
	if !ok || len(m.spares) == 0 || !fitsSpare(r, want) {
		return Lease{}, false
	}
	l := m.spares[len(m.spares)-1]
	m.spares = m.spares[:len(m.spares)-1]
	return l, true
}

// keepSpares makes spares until there are Config.Spares, each time it is woken (at the
// start, after a spare is taken, at every Run round), until ctx ends.
func (m *Manager) keepSpares(ctx context.Context) {
	r, ok := m.spareRequest()
	if !ok {
		return
	}
	for {
		for ctx.Err() == nil {
			made, err := m.makeSpare(ctx, r)
			if err != nil && ctx.Err() == nil {
				m.log.Warn("spare lease not made; trying again later", "err", err)
			}
			if !made {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-m.spareWake:
		}
	}
}

// wakeSpares asks keepSpares to look again.
func (m *Manager) wakeSpares() {
	select {
	case m.spareWake <- struct{}{}:
	default:
	}
}

// makeSpare makes one spare if one is missing, a lease could use it and a uid is free.
func (m *Manager) makeSpare(ctx context.Context, r Request) (bool, error) {
	m.mu.Lock()
	if len(m.spares)+len(m.making) >= m.cfg.Spares || len(m.leases) >= m.cfg.MaxLeases {
		m.mu.Unlock()
		return false, nil
	}
	uid, err := m.uids.take()
	if err != nil {
		m.mu.Unlock()
		return false, nil // the uids are the leases'
	}
	id := newID()
	m.making = append(m.making, id)
	m.mu.Unlock()

	l := m.newLease(id, uid, r)
	err = m.build(ctx, l)
	m.mu.Lock()
	m.making = slices.DeleteFunc(m.making, func(s string) bool { return s == id })
	if err == nil {
		m.spares = append(m.spares, l)
	} else {
		m.uids.free(uid)
	}
	m.mu.Unlock()
	return err == nil, err
}

// dropSpareLocked takes one spare out of the pool and tears it down in the background:
// its uid is free once its directory is gone (retire). Call with mu held; false when
// there was none.
func (m *Manager) dropSpareLocked() bool {
	if len(m.spares) == 0 {
		return false
	}
	l := m.spares[0]
	m.spares = m.spares[1:]
	r := &retiree{lease: l, running: true}
	m.retiring[l.ID] = r
	go func() {
		if p := m.cfg.Provisioner; p != nil {
			if err := p.Teardown(context.Background(), l); err != nil {
				m.log.Error("spare lease teardown failed", "lease", l.ID, "err", err)
			}
		}
		m.retire(r)
	}()
	return true
}

// Spares is how many spare leases are ready.
func (m *Manager) Spares() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.spares)
}

// DropSpares tears every spare down and waits for their directories to go. Call it once
// nothing makes spares any more (Run has returned) and while the Provisioner still works.
func (m *Manager) DropSpares(ctx context.Context) error {
	m.mu.Lock()
	spares := m.spares
	m.spares = nil
	m.mu.Unlock()
	var errs []error
	for _, l := range spares {
		if p := m.cfg.Provisioner; p != nil {
			errs = append(errs, p.Teardown(ctx, l))
		}
		if err := m.dropDir(ctx, l.Dir); err != nil {
			errs = append(errs, err) // its uid stays taken, as a retiree's would
			continue
		}
		m.mu.Lock()
		m.uids.free(l.UID)
		m.mu.Unlock()
	}
	return errors.Join(errs...)
}
