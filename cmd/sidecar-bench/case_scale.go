package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// sparePace spaces the acquires of the spare rows: the daemon makes the next spare lease
// once the daemon is quiet after a take, 250 ms after it at the latest (lease/spare.go),
// and making it takes some tens of ms.
const sparePace = 500 * time.Millisecond

// caseScale: the lease-count curve. With 10, 100, (1,000) leases held, acquire + release
// of one more, back to back (each acquire makes its lease) and at an agent's pace (each
// takes a spare made ahead), exec true in a held lease (alone, and between those
// acquires), the daemon's resident memory and
// that of the daemon with every process under it. Flat rows mean no per-operation cost
// grows with the leases held (the lease journal; before it every change rewrote the whole
// table).
func (b *bench) caseScale(ctx context.Context) error {
	var held []*client.Lease
	defer func() {
		for _, l := range held {
			_ = l.Release(context.WithoutCancel(ctx))
		}
	}()
	var rss, tree []string
	for _, n := range b.sz.scaleHeld {
		for len(held) < n {
			l, err := b.acquire(ctx, apitype.Limits{})
			if err != nil {
				return fmt.Errorf("holding lease %d of %d: %w", len(held)+1, n, err)
			}
			held = append(held, l)
		}
		probe := held[len(held)/2]
		// Exec alone first: in the interleave below each exec follows an acquire +
		// release, whose background work (the lease's teardown) overlaps it.
		alone, err := interleave(ctx, 2, b.sz.reps,
			timed("exec alone", func(ctx context.Context) error { return execTrue(ctx, probe) }),
			timed("fork/exec", forkExecTrue))
		if err != nil {
			return err
		}
		b.add(row{name: fmt.Sprintf("exec alone, %d leases held", n), unit: latency, sidecar: alone[0],
			floorName: "local fork/exec", floor: alone[1]})
		s, err := interleave(ctx, 2, b.sz.reps,
			timed("acquire + release", b.acquireRelease),
			timed("exec", func(ctx context.Context) error { return execTrue(ctx, probe) }),
			timed("fork/exec", forkExecTrue))
		if err != nil {
			return err
		}
		spare, err := interleave(ctx, 1, b.sz.reps, afterIdle("acquire + release, a spare ready", sparePace, b.acquireRelease))
		if err != nil {
			return err
		}
		b.add(row{name: fmt.Sprintf("acquire + release, %d leases held", n), unit: latency, sidecar: s[0],
			floorName: "local fork/exec", floor: s[2]})
		b.add(row{name: fmt.Sprintf("acquire + release with a spare ready, %d leases held", n), unit: latency,
			sidecar: spare[0], floorName: "local fork/exec", floor: s[2]})
		b.add(row{name: fmt.Sprintf("exec `true`, %d leases held", n), unit: latency, sidecar: s[1],
			floorName: "local fork/exec", floor: s[2]})
		st := daemontest.ReadProcStatus(b.d.Pid())
		rss = append(rss, fmt.Sprintf("%d held: %.1f MB", n, float64(st.RSSKB)*1.024/1e3))
		tree = append(tree, fmt.Sprintf("%d held: %s", n, readTreeMemory(b.d.Pid())))
	}
	b.note("Daemon RSS with leases held (lease-count curve): %s.", strings.Join(rss, ", "))
	b.note("The daemon and every process under it (script workers, each lease's zygote and launcher): %s.", strings.Join(tree, "; "))
	return nil
}

// acquireRelease acquires a lease of the default shape and releases it.
func (b *bench) acquireRelease(ctx context.Context) error {
	l, err := b.acquire(ctx, apitype.Limits{})
	if err != nil {
		return err
	}
	return l.Release(ctx)
}
