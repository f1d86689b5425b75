package sidecar

import (
	"net/http"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/lease"
)

// Drain: a draining daemon takes no new lease while the ones it holds run to their end,
// so that it can be stopped (upgraded, its host maintained) without losing a lease that
// was never placed on it. The state lives in memory only: a restart ends a drain, since
// the process that comes back is the upgraded one and should take leases again (docs/
// operations.md, Several sidecars). What a draining daemon still does, and why:
//   - acquiring for a session that holds a lease here returns that lease, so an app that
//     re-acquires by session id (client.Provider) keeps its session where it lives;
//   - every call on an existing lease, renewals included, works as before;
//   - an acquire already past the drain check when the drain starts completes, as any
//     request in flight does: a drain is followed by waiting for active_leases to reach 0;
//   - GET /readyz fails (503 draining): Kubernetes takes the pod out of the rotation and a
//     PodDisruptionBudget counts it as disrupted. GET /healthz (liveness) stays 200.

// SetDraining starts (true) or ends (false) a drain and reports whether it changed.
func (s *Server) SetDraining(on bool) bool {
	if s.draining.Swap(on) == on {
		return false
	}
	if on {
		s.log.Warn("draining: new leases are refused; existing leases run to their end", "active_leases", s.activeLeases())
	} else {
		s.log.Info("drain ended: new leases are taken again")
	}
	return true
}

// Draining reports whether the daemon refuses new leases.
func (s *Server) Draining() bool { return s.draining.Load() }

func (s *Server) activeLeases() int {
	n := 0
	now := s.now()
	for _, l := range s.opts.Leases.List() {
		if l.Active(now) {
			n++
		}
	}
	return n
}

func (s *Server) handleDrain(w http.ResponseWriter, r *http.Request, _ principal) error {
	s.SetDraining(r.Method == http.MethodPost)
	return writeJSON(w, http.StatusOK, apitype.DrainStatus{Draining: s.Draining(), ActiveLeases: s.activeLeases()})
}

// handleReadyz is the readiness probe: 200 while the daemon takes new leases, 503
// draining while it drains.
func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request, _ principal) error {
	if s.Draining() {
		return errDraining()
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, err := w.Write([]byte("ok\n"))
	return err
}

func errDraining() *Error {
	return errorf(http.StatusServiceUnavailable, apitype.CodeDraining, "this sidecar is draining: it takes no new lease; place the session on another sidecar")
}

// sessionLease is the active lease of session, if this daemon holds one: what Acquire
// would return without creating anything.
func (s *Server) sessionLease(session string) (lease.Lease, bool) {
	now := s.now()
	for _, l := range s.opts.Leases.List() {
		if l.SessionID == session && l.Active(now) {
			return l, true
		}
	}
	return lease.Lease{}, false
}

// capacity is the free room GET /v1/info reports, counted from the lease table.
func (s *Server) capacity() apitype.Capacity {
	c := apitype.Capacity{MemoryBytes: s.opts.CapacityMemoryBytes}
	now := s.now()
	for _, l := range s.opts.Leases.List() {
		if l.Active(now) {
			c.ActiveLeases++
			c.MemoryCommittedBytes += l.Limits.MemoryBytes
		}
	}
	c.FreeLeases = max(0, s.opts.Info.Limits.MaxLeases-c.ActiveLeases)
	c.MemoryHeadroomBytes = max(0, c.MemoryBytes-c.MemoryCommittedBytes)
	return c
}
