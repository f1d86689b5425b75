package lease

import (
	"context"
	"fmt"

	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
)

// SetNetwork replaces an active lease's network policy: checked, applied by the
// Provisioner (if it is a NetworkSetter) to connections opened from then on, and kept
// across restarts.
func (m *Manager) SetNetwork(ctx context.Context, id string, p netpolicy.Policy) (Lease, error) {
	if err := m.cfg.checkNetwork(p); err != nil {
		return Lease{}, err
	}
	m.mu.Lock()
	e := m.leases[id]
	if e == nil || e.state != stateLive {
		m.mu.Unlock()
		return Lease{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if !e.lease.Active(m.cfg.Now()) {
		l := e.snapshot()
		m.mu.Unlock()
		return l, fmt.Errorf("%w: %s", ErrExpired, id)
	}
	old := e.lease.Network
	e.lease.Network = p
	l := e.snapshot()
	m.mu.Unlock()

	undo := func() {
		m.mu.Lock()
		e.lease.Network = old
		m.mu.Unlock()
	}
	if ns, ok := m.cfg.Provisioner.(NetworkSetter); ok {
		if err := ns.SetNetwork(ctx, l); err != nil {
			undo()
			return Lease{}, err
		}
	}
	if err := m.persistLease(id); err != nil {
		undo()
		if ns, ok := m.cfg.Provisioner.(NetworkSetter); ok {
			prev := l
			prev.Network = old
			_ = ns.SetNetwork(ctx, prev)
		}
		return Lease{}, err
	}
	return l, nil
}
