package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sidecar-sandbox/sidecar/cmd/sidecar-soak/workload"
)

// report is what a soak found.
type report struct {
	leases, rounds, ops, errors int
	firstErr                    error
	p50, p99, max               time.Duration
	duration                    time.Duration
	idle, final                 resources
	peakRSS                     int64
	heapWait                    time.Duration // until the heap was back near idle
}

// leaked counts resources held beyond idle, and the heap when it never came back.
func (r report) leaked() int {
	n := r.final.leakedSince(r.idle)
	if r.idle.heap >= 0 && r.final.heap > nearIdle(r.idle.heap) {
		n++
	}
	return n
}

// soak runs o.leases workers for o.duration, each repeating one lease's life.
func soak(ctx context.Context, t *target, o options, log *slog.Logger) (report, error) {
	payload := make([]byte, o.payload<<10)
	_, _ = rand.Read(payload)
	var rep report
	rep.leases = o.leases

	say := func(format string, a ...any) {
		if o.progress > 0 {
			fmt.Fprintf(os.Stderr, "sidecar-soak: "+format+"\n", a...)
		}
	}
	say("warm-up round, then %d leases at once for %v (a line every %v)", o.leases, o.duration, o.progress)
	// One warm-up round, then the idle baseline.
	if _, err := workload.Round(ctx, t.client, "soak-warm-up", 10*time.Minute, payload); err != nil {
		return rep, fmt.Errorf("warm-up round: %w", err)
	}
	rep.idle = settle(ctx, t, nil)

	var peak atomic.Int64
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() { // RSS every 250 ms
		defer close(sampled)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			if rss := t.rss(); rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	start := time.Now()
	deadline := start.Add(o.duration)
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	if o.progress > 0 {
		tick := time.NewTicker(o.progress)
		defer tick.Stop()
		go progressLines(sampleCtx, tick.C, os.Stderr, func(now time.Time) progress {
			mu.Lock()
			defer mu.Unlock()
			return progress{elapsed: now.Sub(start), total: o.duration, rounds: rep.rounds, ops: len(lat), errors: rep.errors, rss: t.rss(), peakRSS: peak.Load()}
		})
	}
	for w := range o.leases {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				l, err := workload.Round(ctx, t.client, fmt.Sprintf("soak-%d-%d", w, i), 10*time.Minute, payload)
				mu.Lock()
				lat = append(lat, l...)
				rep.rounds++
				if err != nil && ctx.Err() == nil {
					rep.errors++
					if rep.firstErr == nil {
						rep.firstErr = fmt.Errorf("worker %d round %d: %w", w, i, err)
					}
					log.Warn("round failed", "worker", w, "round", i, "err", err)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	rep.duration = time.Since(start)
	stopSampling()
	<-sampled
	rep.peakRSS = peak.Load()
	if ctx.Err() != nil {
		return rep, ctx.Err()
	}

	say("load done after %v: %d rounds, %d errors; waiting for the daemon to settle (at most 30 s) and its heap to come back (at most 150 s)",
		rep.duration.Round(time.Second), rep.rounds, rep.errors)
	slices.Sort(lat)
	rep.ops = len(lat)
	if n := len(lat); n > 0 {
		rep.p50, rep.p99, rep.max = lat[n/2], lat[n*99/100], lat[n-1]
	}
	rep.final = settle(ctx, t, &rep.idle)
	rep.final.heap, rep.heapWait = heapBack(ctx, t, rep.idle.heap)
	return rep, nil
}

// heapBack waits for the daemon's heap to come back near its idle size: an idle Go
// program collects at least every two minutes, so garbage left by the load is gone
// within about that. It returns the last heap seen and how long it took.
func heapBack(ctx context.Context, t *target, idle int64) (int64, time.Duration) {
	start := time.Now()
	for {
		heap := t.count(ctx).heap
		if heap < 0 || idle < 0 || heap <= nearIdle(idle) || time.Since(start) > 150*time.Second || ctx.Err() != nil {
			return heap, time.Since(start)
		}
		time.Sleep(2 * time.Second) // poll interval
	}
}

// nearIdle is how much heap still counts as "back at idle".
func nearIdle(idle int64) int64 { return 2*idle + 8<<20 }

// progress is the state of a running soak, for a progress line.
type progress struct {
	elapsed, total      time.Duration
	rounds, ops, errors int
	rss, peakRSS        int64
}

func (p progress) String() string {
	return fmt.Sprintf("%v of %v: %d rounds, %d operations, %d errors; daemon RSS %s (peak %s)",
		p.elapsed.Round(time.Second), p.total, p.rounds, p.ops, p.errors, mib(p.rss), mib(p.peakRSS))
}

// progressLines writes a line to w at each tick, with the state now says, until ctx
// ends: a soak of half an hour says how it goes.
func progressLines(ctx context.Context, ticks <-chan time.Time, w io.Writer, now func(time.Time) progress) {
	for {
		select {
		case <-ctx.Done():
			return
		case at := <-ticks:
			fmt.Fprintf(w, "sidecar-soak: %v\n", now(at))
		}
	}
}
