package sidecar

import (
	"context"
	"encoding/json"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/lease"
)

// clockHost reports a lease's CPU seconds as the test clock's seconds since t0, so each
// sample says when it was taken.
type clockHost struct {
	fakeHost
	now func() time.Time
	t0  time.Time
}

func (h clockHost) Usage(context.Context, lease.Lease) *apitype.Usage {
	return &apitype.Usage{CPUSeconds: h.now().Sub(h.t0).Seconds()}
}

func getUsage(t *testing.T, s *Server, id, token string) apitype.UsageHistory {
	t.Helper()
	w := do(s, "GET", "/v1/leases/"+id+"/usage", token, nil)
	if w.Code != http.StatusOK {
		t.Fatalf("usage of %s: %d %s", id, w.Code, w.Body)
	}
	var h apitype.UsageHistory
	if err := json.Unmarshal(w.Body.Bytes(), &h); err != nil {
		t.Fatal(err)
	}
	return h
}

func TestUsageHistoryRing(t *testing.T) {
	t0 := time.Now()
	var now atomic.Int64
	now.Store(t0.UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	s := newHandlerServer(t, func(o *ServerOptions) {
		o.Now = clock
		o.Host = clockHost{now: clock, t0: t0}
	})
	a, b := acquire(t, s, "a"), acquire(t, s, "b")

	h := getUsage(t, s, a.ID, handlerToken)
	if h.IntervalSeconds != 10 || h.Samples == nil || len(h.Samples) != 0 {
		t.Fatalf("before any sample: %+v, want interval 10 and an empty list", h)
	}
	const taken = apitype.UsageHistorySamples + 40
	for range taken {
		s.sampleUsage(context.Background())
		now.Add(int64(apitype.UsageSampleInterval))
	}
	h = getUsage(t, s, a.ID, a.Token) // its own lease token reads it too
	if len(h.Samples) != apitype.UsageHistorySamples {
		t.Fatalf("%d samples after %d taken, want the last %d", len(h.Samples), taken, apitype.UsageHistorySamples)
	}
	// Oldest first, the first 40 dropped, one every interval.
	for i, smp := range h.Samples {
		want := float64((40 + i) * 10)
		if smp.CPUSeconds != want || !smp.At.Equal(t0.Add(time.Duration(want)*time.Second).UTC()) {
			t.Fatalf("sample %d: %+v, want the one taken at +%vs", i, smp, want)
		}
	}
	wantProblem(t, do(s, "GET", "/v1/leases/"+a.ID+"/usage", b.Token, nil), http.StatusForbidden, apitype.CodeForbidden)

	// A released lease's history goes at the next sample.
	if w := do(s, "DELETE", "/v1/leases/"+b.ID, handlerToken, nil); w.Code != http.StatusNoContent {
		t.Fatalf("release: %d %s", w.Code, w.Body)
	}
	s.sampleUsage(context.Background())
	s.usage.mu.Lock()
	_, kept := s.usage.rings[b.ID]
	n := len(s.usage.rings)
	s.usage.mu.Unlock()
	if kept || n != 1 {
		t.Fatalf("after b's release: b's ring kept %v, %d rings", kept, n)
	}
	wantProblem(t, do(s, "GET", "/v1/leases/"+b.ID+"/usage", handlerToken, nil), http.StatusNotFound, apitype.CodeLeaseNotFound)
}

// A ring's memory follows the samples it holds, up to the hour it keeps.
func TestUsageRingGrowsWithItsSamples(t *testing.T) {
	const most = apitype.UsageHistorySamples
	var r usageRing
	for i := range most + 5 {
		r.add(apitype.UsageSample{Usage: apitype.Usage{Pids: int64(i)}})
		got, n := r.samples(), min(i+1, most)
		if len(got) != n || got[0].Pids != int64(i+1-n) || got[n-1].Pids != int64(i) {
			t.Fatalf("after %d samples: %d held, %d..%d, want %d held, %d..%d", i+1, len(got), got[0].Pids, got[len(got)-1].Pids, n, i+1-n, i)
		}
		if c := cap(r.buf); c > most || c > 2*n+4 {
			t.Fatalf("after %d samples: room for %d", i+1, c)
		}
	}
}
