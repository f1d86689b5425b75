package sidecar

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/docs"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
)

func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request, _ principal) error {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, err := w.Write([]byte("ok\n"))
	return err
}

// handleOpenAPI serves docs/openapi.yaml as built in: public, like the repository it
// comes from, and the same for every daemon of this version.
func (s *Server) handleOpenAPI(w http.ResponseWriter, r *http.Request, _ principal) error {
	w.Header().Set("Content-Type", "application/yaml")
	_, err := w.Write(docs.OpenAPI)
	return err
}

func (s *Server) handleInfo(w http.ResponseWriter, r *http.Request, _ principal) error {
	return writeJSON(w, http.StatusOK, s.info())
}

func (s *Server) info() apitype.Info {
	info := s.opts.Info
	info.Version = s.opts.Version
	info.APIVersion = apitype.APIVersion
	caps := s.opts.Host.Caps()
	info.Capabilities = apitype.Capabilities{
		Exec:             true,
		PTY:              true,
		Files:            true,
		Scripts:          s.opts.Scripts != nil,
		Cgroups:          caps.Cgroups,
		UIDIsolation:     caps.UIDIsolation,
		NetworkIsolation: caps.NetworkIsolation,
		Landlock:         caps.LandlockABI,
		PrivateTmp:       caps.PrivateTmp,
		Isolation:        caps.Isolation,
		Seccomp:          caps.Seccomp,
		DiskQuota:        s.opts.Info.Capabilities.DiskQuota,
		Layers:           caps.Layers,
	}
	info.Draining = s.Draining()
	info.Capacity = s.capacity()
	if s.opts.CertNotAfter != nil {
		if t := s.opts.CertNotAfter(); !t.IsZero() {
			t = t.UTC()
			info.CertNotAfter = &t
		}
	}
	return info
}

func (s *Server) handleAcquire(w http.ResponseWriter, r *http.Request, _ principal) error {
	var req apitype.AcquireRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.TTLSeconds < 0 {
		return badRequest("ttl_seconds must not be negative")
	}
	if s.Draining() {
		// The session's lease, if it lives here, is still returned as Acquire would
		// (nothing renewed); no lease is created.
		l, ok := s.sessionLease(req.SessionID)
		if !ok {
			return errDraining()
		}
		out, err := s.leaseWithToken(r.Context(), l, false)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, out)
	}
	l, created, err := s.opts.Leases.Acquire(r.Context(), lease.Request{
		SessionID: req.SessionID,
		TTL:       time.Duration(req.TTLSeconds) * time.Second,
		Limits:    leaseLimits(req.Limits),
		Network:   requestedNetwork(req.Network),
		Labels:    req.Labels,
		Image:     req.Image,
	})
	if err != nil {
		return err
	}
	out, err := s.leaseWithToken(r.Context(), l, created)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/leases/"+l.ID)
	}
	return writeJSON(w, status, out)
}

func (s *Server) handleListLeases(w http.ResponseWriter, r *http.Request, _ principal) error {
	leases := s.opts.Leases.List()
	out := apitype.LeaseList{Leases: make([]apitype.Lease, 0, len(leases))}
	// ?session_id= narrows the list to one session's lease: how a client of several
	// sidecars finds where a session lives before it places a new lease.
	session, filtered := r.URL.Query()["session_id"]
	for _, l := range leases {
		if filtered && l.SessionID != session[0] {
			continue
		}
		out.Leases = append(out.Leases, s.inspect(r.Context(), l))
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetLease(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.opts.Leases.Get(r.PathValue("id"))
	if err != nil && !errors.Is(err, lease.ErrExpired) {
		return err
	}
	// An expired lease that the reaper has not reached yet is still shown, as expired.
	return writeJSON(w, http.StatusOK, s.inspect(r.Context(), l))
}

func (s *Server) handleRenew(w http.ResponseWriter, r *http.Request, _ principal) error {
	var req apitype.RenewRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.TTLSeconds < 0 {
		return badRequest("ttl_seconds must not be negative")
	}
	l, err := s.opts.Leases.Renew(r.Context(), r.PathValue("id"), time.Duration(req.TTLSeconds)*time.Second)
	if err != nil {
		return err
	}
	out, err := s.leaseWithToken(r.Context(), l, false)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request, _ principal) error {
	if err := s.opts.Leases.Release(r.Context(), r.PathValue("id")); err != nil {
		switch {
		case errors.Is(err, lease.ErrNotFound):
			return err
		case errors.Is(err, lease.ErrExpired):
			return errorf(http.StatusNotFound, apitype.CodeLeaseNotFound, "lease already expired and released")
		}
		// A teardown failure (a mount point in the workdir, a cgroup that will not
		// empty) is the host's problem, not the request's; the lease stays and the
		// next release or reap retries it.
		return &Error{Status: http.StatusInternalServerError, Code: apitype.CodeInternal, Detail: "release failed; it will be retried", Err: err}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleCleanup(w http.ResponseWriter, r *http.Request, _ principal) error {
	res, err := s.opts.Host.Cleanup(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, res)
}

// activeLease returns the lease named by {id} if it is active, and notes the activity.
func (s *Server) activeLease(r *http.Request) (lease.Lease, error) {
	id := r.PathValue("id")
	l, err := s.opts.Leases.Get(id)
	if err != nil {
		return l, err
	}
	s.opts.Leases.Touch(id)
	return l, nil
}

// leaseWithToken is the lease with a fresh token: with its live usage and leftovers,
// unless created now, when nothing has run in it yet and asking the kernel would only
// slow the acquire.
func (s *Server) leaseWithToken(ctx context.Context, l lease.Lease, created bool) (apitype.Lease, error) {
	tok, err := s.opts.Tokens.Issue(l)
	if err != nil {
		return apitype.Lease{}, err
	}
	var out apitype.Lease
	if created {
		out = s.describe(l)
	} else {
		out = s.inspect(ctx, l)
	}
	out.Token = tok
	return out, nil
}

// inspect is the lease as the inspection endpoint shows it, with live usage.
func (s *Server) inspect(ctx context.Context, l lease.Lease) apitype.Lease {
	out := s.describe(l)
	out.Usage = s.opts.Host.Usage(ctx, l)
	out.Leftovers, out.LeftoverCount = s.opts.Host.Leftovers(l)
	return out
}

// describe is the lease without what the kernel is asked for: its usage and leftovers.
func (s *Server) describe(l lease.Lease) apitype.Lease {
	state := apitype.LeaseActive
	if !l.Active(s.now()) {
		state = apitype.LeaseExpired
	}
	out := apitype.Lease{
		ID:             l.ID,
		SessionID:      l.SessionID,
		Labels:         l.Labels,
		State:          state,
		Network:        apitype.NetworkPolicy(l.Network),
		Image:          leaseImage(l),
		CreatedAt:      l.CreatedAt,
		ExpiresAt:      l.ExpiresAt,
		LastActivityAt: l.LastActivityAt,
		Limits: apitype.Limits{
			MemoryBytes:   l.Limits.MemoryBytes,
			CPUMillicores: l.Limits.CPUMillicores,
			Pids:          l.Limits.Pids,
			DiskBytes:     l.Limits.DiskBytes,
		},
		UID:       l.UID,
		Workdir:   sandbox.Workspace, // the workdir's name in the API (and, isolated, in the lease)
		Processes: s.opts.Processes.Running(l.ID),
	}
	if s.opts.Network != nil {
		if st, ok := s.opts.Network.Stats(l.ID); ok {
			out.NetworkStats = &apitype.NetworkStats{
				BytesSent: st.BytesSent, BytesReceived: st.BytesReceived,
				ConnectionsAllowed: st.ConnectionsAllowed, ConnectionsDenied: st.Denied, ConnectionsOpen: st.Open,
			}
		}
	}
	return out
}

// leaseImage is the image name the API shows: "host" for the host's root filesystem.
func leaseImage(l lease.Lease) string {
	if l.Image == "" {
		return lease.HostImage
	}
	return l.Image
}

// requestedNetwork is a request's policy; nil takes the daemon's default.
func requestedNetwork(p *apitype.NetworkPolicy) netpolicy.Policy {
	if p == nil {
		return netpolicy.Policy{}
	}
	return netpolicy.Policy(*p)
}

func leaseLimits(l apitype.Limits) lease.Limits {
	return lease.Limits{MemoryBytes: l.MemoryBytes, CPUMillicores: l.CPUMillicores, Pids: l.Pids, DiskBytes: l.DiskBytes}
}
