package main

import (
	"context"
	"fmt"
	"os/exec"
	"sync/atomic"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// sessionSeq makes every lease of the run a session of its own.
var sessionSeq atomic.Int64

func (b *bench) acquire(ctx context.Context, limits apitype.Limits) (*client.Lease, error) {
	return b.c.Acquire(ctx, apitype.AcquireRequest{
		SessionID: fmt.Sprintf("bench-%d", sessionSeq.Add(1)), TTLSeconds: 3600, Limits: limits})
}

// execTrue runs true in the lease and insists it succeeded.
func execTrue(ctx context.Context, l *client.Lease) error {
	res, err := l.Exec(ctx, apitype.ExecRequest{Argv: []string{"true"}})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("true exited %d (signal %q)", res.ExitCode, res.Signal)
	}
	return err
}

// forkExecTrue is the floor of every exec: os/exec of true on this machine.
func forkExecTrue(ctx context.Context) error { return exec.CommandContext(ctx, "true").Run() }

// caseExec: run true with a lease held, vs ssh multiplexed, vs a local fork/exec.
func (b *bench) caseExec(ctx context.Context) error {
	l, err := b.acquire(ctx, apitype.Limits{})
	if err != nil {
		return err
	}
	defer l.Release(context.WithoutCancel(ctx))
	s, err := interleave(ctx, 3, b.sz.reps, b.withEnvd(timed,
		timed("sidecar", func(ctx context.Context) error { return execTrue(ctx, l) }),
		timed("ssh", func(ctx context.Context) error { return b.ssh.ssh(ctx, "bench-mux", "true").Run() }),
		timed("fork/exec", forkExecTrue),
		timed("lease info", func(ctx context.Context) error { _, err := l.Get(ctx); return err }))...)
	if err != nil {
		return err
	}
	b.add(row{name: "exec `true`, lease held", unit: latency, sidecar: s[0],
		peerName: "ssh, multiplexed", peer: s[1], floorName: "local fork/exec", floor: s[2]})
	b.addEnvd("exec `true`, lease held", s)
	// Where an exec's time goes: the same connection's cheapest authenticated round trip.
	b.add(row{name: "(attribution) GET lease, same connection", unit: latency, sidecar: s[3],
		peerName: "ssh, multiplexed", peer: s[1], floorName: "local fork/exec", floor: s[2]})
	return nil
}

// withEnvd appends an envd contender running true, made by wrap, to cs when the run has
// envd; the contender's samples come last.
func (b *bench) withEnvd(wrap func(string, func(context.Context) error) contender, cs ...contender) []contender {
	if b.envd == nil {
		return cs
	}
	return append(cs, wrap("envd", func(ctx context.Context) error { return b.envd.run(ctx, "/bin/true") }))
}

// addEnvd adds name's row against envd (the last samples of s, from withEnvd), sidecar's
// and the floor's samples from s[0] and s[2]; nothing without envd.
func (b *bench) addEnvd(name string, s []samples) {
	if b.envd != nil {
		b.add(row{name: name + ", against envd", unit: latency, sidecar: s[0],
			peerName: "envd " + b.envd.version + ", plain HTTP", peer: s[len(s)-1], floorName: "local fork/exec", floor: s[2]})
	}
}

// caseLease: acquire + first command + release, vs a fresh ssh connection running true.
func (b *bench) caseLease(ctx context.Context) error {
	s, err := interleave(ctx, 2, max(b.sz.reps/3, 5),
		timed("sidecar", func(ctx context.Context) error {
			l, err := b.acquire(ctx, apitype.Limits{})
			if err != nil {
				return err
			}
			if err := execTrue(ctx, l); err != nil {
				_ = l.Release(ctx)
				return err
			}
			return l.Release(ctx)
		}),
		timed("ssh", func(ctx context.Context) error { return b.ssh.ssh(ctx, "bench", "true").Run() }),
		timed("fork/exec", forkExecTrue))
	if err != nil {
		return err
	}
	b.add(row{name: "acquire + `true` + release", unit: latency, sidecar: s[0],
		peerName: "fresh `ssh host true`", peer: s[1], floorName: "local fork/exec", floor: s[2]})
	return nil
}

// transform is the small QuickJS transform of the script case.
const transform = `function transform(input) {
  return { total: input.items.reduce((s, x) => s + x.price * x.qty, 0), n: input.items.length };
}`

// caseScript: warm QuickJS transform latency (no peer: OpenSSH has nothing like it).
func (b *bench) caseScript(ctx context.Context) error {
	input := map[string]any{"items": []map[string]any{{"price": 3, "qty": 2}, {"price": 5, "qty": 1}}}
	s, err := interleave(ctx, 10, b.sz.scriptRuns,
		timed("sidecar", func(ctx context.Context) error {
			res, err := b.c.RunScript(ctx, apitype.ScriptRequest{Source: transform, Input: input})
			if err != nil {
				return err
			}
			if m, ok := res.Result.(map[string]any); !ok || m["total"] != float64(11) {
				return fmt.Errorf("transform returned %v", res.Result)
			}
			return nil
		}))
	if err != nil {
		return err
	}
	b.add(row{name: "QuickJS transform, warm", unit: latency, sidecar: s[0]})
	return nil
}
