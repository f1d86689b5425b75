package sidecar

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// usageHistory keeps, per lease, a ring of its last apitype.UsageHistorySamples usage
// samples (an hour at one every apitype.UsageSampleInterval): what GET …/usage serves,
// and the console draws. A ring grows with the samples it holds (most leases live
// minutes), up to 360 × 64 bytes: 23 KiB.
type usageHistory struct {
	mu    sync.Mutex
	rings map[string]*usageRing
}

type usageRing struct {
	buf  []apitype.UsageSample // grows to apitype.UsageHistorySamples, then wraps
	next int                   // once full, where the next sample goes: the oldest
}

func (r *usageRing) add(s apitype.UsageSample) {
	const most = apitype.UsageHistorySamples
	switch {
	case len(r.buf) == most:
		r.buf[r.next] = s
		r.next = (r.next + 1) % most
	case len(r.buf) == cap(r.buf): // doubling, but never past most
		r.buf = append(make([]apitype.UsageSample, 0, min(2*len(r.buf)+4, most)), r.buf...)
		fallthrough
	default:
		r.buf = append(r.buf, s)
	}
}

// samples are the ring's samples, oldest first.
func (r *usageRing) samples() []apitype.UsageSample {
	out := make([]apitype.UsageSample, 0, len(r.buf))
	return append(append(out, r.buf[r.next:]...), r.buf[:r.next]...)
}

// RunUsageSampler samples every active lease's usage every apitype.UsageSampleInterval
// until ctx ends.
func (s *Server) RunUsageSampler(ctx context.Context) {
	t := time.NewTicker(apitype.UsageSampleInterval)
	defer t.Stop()
	for {
		s.sampleUsage(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sampleUsage takes one sample of every active lease, and forgets the leases gone.
func (s *Server) sampleUsage(ctx context.Context) {
	leases := s.opts.Leases.List()
	taken := make(map[string]apitype.UsageSample, len(leases))
	for _, l := range leases {
		if u := s.opts.Host.Usage(ctx, l); u != nil {
			taken[l.ID] = apitype.UsageSample{At: s.now().UTC(), Usage: *u}
		}
	}
	h := &s.usage
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rings == nil {
		h.rings = make(map[string]*usageRing)
	}
	for id := range h.rings {
		if _, ok := taken[id]; !ok {
			delete(h.rings, id)
		}
	}
	for id, sample := range taken {
		r := h.rings[id]
		if r == nil {
			r = &usageRing{}
			h.rings[id] = r
		}
		r.add(sample)
	}
}

// handleUsage serves the lease's usage history, oldest sample first.
func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.opts.Leases.Get(r.PathValue("id"))
	if err != nil {
		return err
	}
	out := apitype.UsageHistory{IntervalSeconds: int64(apitype.UsageSampleInterval / time.Second), Samples: []apitype.UsageSample{}}
	s.usage.mu.Lock()
	if ring := s.usage.rings[l.ID]; ring != nil {
		out.Samples = ring.samples()
	}
	s.usage.mu.Unlock()
	return writeJSON(w, http.StatusOK, out)
}
