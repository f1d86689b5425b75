package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// loadInterval paces each lease in the paced phase: one command a second per lease is a
// busy agent; the saturated phase sends the next command as soon as the last returns.
const loadInterval = time.Second

// loadResult is one phase of the many-leases case, for sidecar or for its floor.
type loadResult struct {
	phase     string
	execs     int
	errors    []string
	lat       samples
	elapsed   time.Duration
	cpu       time.Duration // the daemon's (sidecar only)
	maxRSSKB  int64
	endStatus daemontest.ProcStatus
}

func (r loadResult) rate() float64 { return float64(r.execs) / r.elapsed.Seconds() }

// caseLoad: many leases at once, each running true, first paced (latency under a
// realistic load) then saturated (throughput); the daemon's CPU and memory from /proc.
// The floor runs the same loops as local fork/execs of true, as many at once, right
// after each sidecar phase: what this machine's kernel does with that many forks.
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
	var results, floors []loadResult
	for _, paced := range []bool{true, false} {
		r := b.loadPhase(ctx, n, paced, b.d.Pid(), func(ctx context.Context, i int) error { return execTrue(ctx, leases[i]) })
		f := b.loadPhase(ctx, n, paced, 0, func(ctx context.Context, _ int) error { return forkExecTrue(ctx) })
		results, floors = append(results, r), append(floors, f)
		b.log.Info("load phase", "phase", r.phase, "execs", r.execs, "errors", len(r.errors),
			"p50", r.lat.median(), "p99", r.lat.percentile(99), "floor_p50", f.lat.median(), "floor_p99", f.lat.percentile(99))
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	var t strings.Builder
	fmt.Fprintf(&t, "%d leases (64 MiB, 64 pids each) running `true` for %s per phase; the floor is as many local fork/execs of `true` at once, each phase right after sidecar's:\n\n", n, b.sz.loadFor)
	t.WriteString("  | phase | execs | execs/s | p50 | p99 | max | errors | daemon CPU | daemon RSS max (sampled) | daemon VmHWM |\n")
	t.WriteString("  |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var failed []string
	for i, r := range results {
		fmt.Fprintf(&t, "  | %s | %d | %.0f | %s | %s | %s | %d | %.2f s (%.0f%% of a core) | %.0f MB | %.0f MB |\n",
			r.phase, r.execs, r.rate(), latency.format(r.lat.median()),
			latency.format(r.lat.percentile(99)), latency.format(r.lat.percentile(100)), len(r.errors),
			r.cpu.Seconds(), 100*r.cpu.Seconds()/r.elapsed.Seconds(), float64(r.maxRSSKB)*1.024/1e3,
			float64(r.endStatus.HWMKB)*1.024/1e3)
		f := floors[i]
		fmt.Fprintf(&t, "  | floor, %s | %d | %.0f | %s | %s | %s | %d | | | |\n",
			f.phase, f.execs, f.rate(), latency.format(f.lat.median()),
			latency.format(f.lat.percentile(99)), latency.format(f.lat.percentile(100)), len(f.errors))
		for _, x := range []loadResult{r, f} {
			if len(x.errors) > 0 {
				failed = append(failed, fmt.Sprintf("%s: %d errors, first: %s", x.phase, len(x.errors), x.errors[0]))
			}
		}
	}
	paced, sat := results[0], results[1]
	fmt.Fprintf(&t, "\n  sidecar/floor: paced p50 %.2f×, p99 %.2f×; saturated execs/s %.2f×.\n",
		ratio(paced.lat.median(), floors[0].lat.median()), ratio(paced.lat.percentile(99), floors[0].lat.percentile(99)),
		sat.rate()/floors[1].rate())
	b.notes = append(b.notes, t.String())
	if len(failed) > 0 {
		return fmt.Errorf("load: %s", strings.Join(failed, "; "))
	}
	return nil
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

// loadPhase runs n loops of run (i is the loop's index) for the configured time, paced
// or saturated, sampling the daemon's memory when pid is not 0.
func (b *bench) loadPhase(ctx context.Context, n int, paced bool, pid int, run func(context.Context, int) error) loadResult {
	r := loadResult{phase: "saturated"}
	if paced {
		r.phase = fmt.Sprintf("paced, 1 per %s per loop", loadInterval)
	}
	var before daemontest.ProcStatus
	if pid != 0 {
		before = daemontest.ReadProcStatus(pid)
	}
	ctx, cancel := context.WithTimeout(ctx, b.sz.loadFor)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
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
				if err := run(context.WithoutCancel(ctx), i); err != nil {
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
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if pid == 0 {
		<-done
		r.elapsed = time.Since(start)
		return r
	}
	sampler := time.NewTicker(250 * time.Millisecond)
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
