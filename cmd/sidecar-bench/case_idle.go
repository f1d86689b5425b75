package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// idleGaps are the pauses before each exec of the idle case: agents' commands arrive
// with gaps, and what the kernel does after one (an RCU grace period on a cgroup
// migration, a parked CPU) is what users feel, not the back-to-back figure.
var idleGaps = []time.Duration{5 * time.Millisecond, 15 * time.Millisecond, 45 * time.Millisecond, 200 * time.Millisecond}

// afterIdle is a contender that waits gap, untimed, then times f.
func afterIdle(name string, gap time.Duration, f func(ctx context.Context) error) contender {
	return contender{name: name, run: func(ctx context.Context) (time.Duration, error) {
		select {
		case <-time.After(gap):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		start := time.Now()
		err := f(ctx)
		return time.Since(start), err
	}}
}

// caseIdle: exec true after 5, 15, 45 and 200 ms of idle, with ssh and a local fork/exec
// idling the same; the spread column holds p90.
func (b *bench) caseIdle(ctx context.Context) error {
	l, err := b.acquire(ctx, apitype.Limits{})
	if err != nil {
		return err
	}
	defer l.Release(context.WithoutCancel(ctx))
	for _, gap := range idleGaps {
		idle := func(name string, f func(context.Context) error) contender { return afterIdle(name, gap, f) }
		s, err := interleave(ctx, 2, b.sz.reps, b.withEnvd(idle,
			idle("sidecar", func(ctx context.Context) error { return execTrue(ctx, l) }),
			idle("ssh", func(ctx context.Context) error { return b.ssh.ssh(ctx, "bench-mux", "true").Run() }),
			idle("fork/exec", forkExecTrue))...)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("exec `true` after %v idle", gap)
		b.add(row{name: name, unit: latency, sidecar: s[0],
			peerName: "ssh, multiplexed", peer: s[1], floorName: "local fork/exec", floor: s[2]})
		b.addEnvd(name, s)
	}
	return nil
}
