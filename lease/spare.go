package lease

import (
	"context"
	"slices"
	"time"
)

// Spare leases take a lease's whole set-up off the acquire path. A spare is made ahead for
// a request of the default shape (default limits, network and image): its directory,
// filesystem and Provisioner.Provision (cgroup, network namespace, image root, its first
// launcher) are done, so an acquire of that shape only gives it a session and journals it.
// A spare is not a lease yet: Get and List do not see it, it holds no slot of MaxLeases,
// no journal records it (a crash leaves an orphan the startup sweep removes) and
// DropSpares takes it down. It does hold a uid: an acquire that finds none free takes a
// spare down first. A spare whose image changed since it was made (Config.SpareCurrent)
// is taken down instead of handed out.

// The next spare is made once the daemon is quiet: spareQuiet without a request on the
// lease the last one became (an agent's commands come in bursts with pauses between) and
// without an acquire or release of any lease; spareAfterTake after the take at the
// latest. Made beside that lease's commands, or beside acquires that make their own
// leases, its set-up (about what an acquire costs) would share the CPUs with them; made
// at a fixed delay, it slowed every acquire that came at about that delay after the last.
const (
	spareQuiet     = 100 * time.Millisecond
	spareAfterTake = 250 * time.Millisecond
)

// spareRetry is how often keepSpares looks again while the default image is not ready.
const spareRetry = time.Second

// spareRequest is the normalized request spares are made for now; ok false when no spare
// is wanted or the default request cannot be served now (its image is being pulled).
func (m *Manager) spareRequest() (Request, bool) {
	if m.cfg.Spares <= 0 {
		return Request{}, false
	}
	r, err := m.cfg.normalize(Request{SessionID: "spare"})
	return r, err == nil
}

// fitsSpare says whether normalized request r gets what spare was provisioned with.
func fitsSpare(r Request, spare Lease) bool {
	return r.Image == spare.Image && r.Limits == spare.Limits &&
		r.Network.Egress == spare.Network.Egress &&
		slices.Equal(r.Network.AllowOut, spare.Network.AllowOut) &&
		slices.Equal(r.Network.DenyOut, spare.Network.DenyOut)
}

// takeSpareLocked hands out a spare that fits r, if there is one. Call with mu held.
func (m *Manager) takeSpareLocked(r Request) (Lease, bool) {
	i := slices.IndexFunc(m.spares, func(l Lease) bool { return fitsSpare(r, l) })
	if i < 0 {
		return Lease{}, false
	}
	l := m.spares[i]
	m.spares = slices.Delete(m.spares, i, i+1)
	return l, true
}

// spareCurrent says whether spare still gets what a lease made now would.
func (m *Manager) spareCurrent(spare Lease) bool {
	return m.cfg.SpareCurrent == nil || m.cfg.SpareCurrent(spare)
}

// keepSpares makes spares until there are Config.Spares, each time it is woken (at the
// start, after a spare is taken, at every Run round), until ctx ends. While the default
// request cannot be served (its image is being pulled), it looks again every spareRetry.
func (m *Manager) keepSpares(ctx context.Context) {
	for {
		retry := false
		for ctx.Err() == nil {
			r, ok := m.spareRequest()
			if !ok {
				retry = m.cfg.Spares > 0
				break
			}
			made, err := m.makeSpare(ctx, r)
			if err != nil && ctx.Err() == nil {
				// Tried again at the next wake: a Run round at the latest.
				m.log.Warn("spare lease not made; trying again later", "err", err)
			}
			if !made {
				break
			}
		}
		var again <-chan time.Time
		if retry {
			again = time.After(spareRetry)
		}
		select {
		case <-ctx.Done():
			return
		case <-m.spareWake:
		case <-again:
		}
	}
}

// refillAfterTake wakes keepSpares once the daemon is quiet after lease id was made of a
// spare, or spareAfterTake from now at the latest.
func (m *Manager) refillAfterTake(id string) {
	latest := time.Now().Add(spareAfterTake)
	go func() {
		for {
			last := m.lastTurnover.Load()
			m.mu.RLock()
			if e := m.leases[id]; e != nil {
				last = max(last, e.lastActivity.Load())
			}
			m.mu.RUnlock()
			d := refillWait(m.cfg.Now().Sub(time.Unix(0, last)), time.Until(latest))
			if d <= 0 {
				m.wakeSpares()
				return
			}
			time.Sleep(d)
		}
	}()
}

// refillWait is how long the next spare still waits, sinceActivity after the last request
// it waits out and left before spareAfterTake runs out.
func refillWait(sinceActivity, left time.Duration) time.Duration {
	return max(0, min(left, spareQuiet-sinceActivity))
}

// noteTurnover records an acquire or release now, for refillAfterTake.
func (m *Manager) noteTurnover() { m.lastTurnover.Store(m.cfg.Now().UnixNano()) }

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

// dropSpareLocked takes one spare out of the pool and down (discardLocked). Call with mu
// held; false when there was none.
func (m *Manager) dropSpareLocked() bool {
	if len(m.spares) == 0 {
		return false
	}
	l := m.spares[0]
	m.spares = m.spares[1:]
	m.discardLocked(l)
	return true
}

// discardLocked tears spare l down in the background: its id stays owned, and its uid
// taken, until its directory is gone (retire). Call with mu held.
func (m *Manager) discardLocked(l Lease) {
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
}

// Spares is how many spare leases are ready.
func (m *Manager) Spares() int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return len(m.spares)
}

// SparesOn is how many spare leases are ready on image (a lease's Image).
func (m *Manager) SparesOn(image string) int {
	m.mu.RLock()
	defer m.mu.RUnlock()
	n := 0
	for _, l := range m.spares {
		if l.Image == image {
			n++
		}
	}
	return n
}

// DropSpares takes every ready spare down and waits until their directories are gone
// (and any other released lease's being removed). Teardown errors are logged: what they
// leave is an orphan to the next sweep.
func (m *Manager) DropSpares(ctx context.Context) error {
	m.mu.Lock()
	for m.dropSpareLocked() {
	}
	m.mu.Unlock()
	return m.waitRetired(ctx)
}
