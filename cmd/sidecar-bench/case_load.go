package main

import (
	"context"
	"fmt"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// loadInterval paces each lease in the paced phase: one command a second per lease is a
// busy agent; the saturated phase sends the next command as soon as the last returns.
const loadInterval = time.Second

// loadResult is one phase of the many-leases case.
type loadResult struct {
	phase     string
	execs     int
	errors    []string
	lat       samples
	elapsed   time.Duration
	cpu       time.Duration
	maxRSSKB  int64
	endStatus daemontest.ProcStatus
}

// caseLoad: many leases at once, each running true, first paced (latency under a
// realistic load) then saturated (throughput); the daemon's CPU and memory from /proc.
func (b *bench) caseLoad(ctx context.Context) error {
	n := b.sz.leases
	leases := make([]*client.Lease, n)
	var acqErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range leases {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			l, err := b.acquire(ctx, apitype.Limits{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil && acqErr == nil {
				acqErr = err
			}
			leases[i] = l
		})
	}
	wg.Wait()
	defer func() {
		for _, l := range leases {
			if l != nil {
				_ = l.Release(context.WithoutCancel(ctx))
			}
		}
	}()
	if acqErr != nil {
		return fmt.Errorf("acquiring %d leases: %w", n, acqErr)
	}
	var results []loadResult
	for _, paced := range []bool{true, false} {
		r := b.loadPhase(ctx, leases, paced)
		results = append(results, r)
		b.log.Info("load phase", "phase", r.phase, "execs", r.execs, "errors", len(r.errors),
			"p50", r.lat.median(), "p99", r.lat.percentile(99))
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	var t strings.Builder
	fmt.Fprintf(&t, "%d leases (64 MiB, 64 pids each) running `true` for %s per phase:\n\n", n, b.sz.loadFor)
	t.WriteString("  | phase | execs | execs/s | p50 | p99 | max | errors | daemon CPU | daemon RSS max (sampled) | daemon VmHWM |\n")
	t.WriteString("  |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var failed []string
	for _, r := range results {
		fmt.Fprintf(&t, "  | %s | %d | %.0f | %s | %s | %s | %d | %.2f s (%.0f%% of a core) | %.0f MB | %.0f MB |\n",
			r.phase, r.execs, float64(r.execs)/r.elapsed.Seconds(), latency.format(r.lat.median()),
			latency.format(r.lat.percentile(99)), latency.format(r.lat.percentile(100)), len(r.errors),
			r.cpu.Seconds(), 100*r.cpu.Seconds()/r.elapsed.Seconds(), float64(r.maxRSSKB)*1.024/1e3,
			float64(r.endStatus.HWMKB)*1.024/1e3)
		if len(r.errors) > 0 {
			failed = append(failed, fmt.Sprintf("%s: %d errors, first: %s", r.phase, len(r.errors), r.errors[0]))
		}
	}
	b.notes = append(b.notes, t.String())
	if len(failed) > 0 {
		return fmt.Errorf("load: %s", strings.Join(failed, "; "))
	}
	return nil
}

// loadPhase runs every lease's loop for the configured time while sampling the daemon.
func (b *bench) loadPhase(ctx context.Context, leases []*client.Lease, paced bool) loadResult {
	r := loadResult{phase: "saturated"}
	if paced {
		r.phase = fmt.Sprintf("paced, 1 per %s per lease", loadInterval)
	}
	pid := b.d.Pid()
	before := daemontest.ReadProcStatus(pid)
	ctx, cancel := context.WithTimeout(ctx, b.sz.loadFor)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for _, l := range leases {
		wg.Go(func() {
			var lat samples
			var errs []string
			next := time.Now().Add(rand.N(loadInterval)) // spread the paced starts
			for {
				if paced {
					select {
					case <-ctx.Done():
					case <-time.After(time.Until(next)):
					}
					next = next.Add(loadInterval)
				}
				if ctx.Err() != nil {
					break
				}
				t0 := time.Now()
				// Each command gets its own time, so the end of the phase does not cut one short.
				err := execTrue(context.WithoutCancel(ctx), l)
				if err != nil {
					errs = append(errs, err.Error())
				} else {
					lat = append(lat, time.Since(t0))
				}
			}
			mu.Lock()
			r.lat = append(r.lat, lat...)
			r.errors = append(r.errors, errs...)
			r.execs += len(lat) + len(errs)
			mu.Unlock()
		})
	}
	sampler := time.NewTicker(250 * time.Millisecond)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-sampler.C:
			r.maxRSSKB = max(r.maxRSSKB, daemontest.ReadProcStatus(pid).RSSKB)
		}
	}
	sampler.Stop()
	r.elapsed = time.Since(start)
	r.endStatus = daemontest.ReadProcStatus(pid)
	r.maxRSSKB = max(r.maxRSSKB, r.endStatus.RSSKB)
	r.cpu = r.endStatus.CPU - before.CPU
	return r
}
