package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// caseStream: a process writing many bytes to stdout, read to the end through an attach,
// vs through ssh, vs through a local pipe.
func (b *bench) caseStream(ctx context.Context) error {
	n := b.sz.streamBytes
	argv := []string{"head", "-c", fmt.Sprint(n), "/dev/zero"}
	l, err := b.acquire(ctx, bigLimits)
	if err != nil {
		return err
	}
	defer l.Release(context.WithoutCancel(ctx))
	s, err := interleave(ctx, 1, b.sz.bigReps,
		timed("sidecar", func(ctx context.Context) error {
			p, err := l.Start(ctx, apitype.StartRequest{Argv: argv})
			if err != nil {
				return err
			}
			defer p.Close()
			errc := make(chan error, 1)
			go func() { _, err := io.Copy(io.Discard, p.Stderr); errc <- err }()
			got, err := io.Copy(io.Discard, p.Stdout)
			if err != nil {
				return err
			}
			if err := <-errc; err != nil {
				return err
			}
			st, err := p.Wait(ctx)
			if err != nil {
				return err
			}
			if got != n || p.Lost() != 0 {
				return fmt.Errorf("read %d of %d bytes (%d lost), status %+v", got, n, p.Lost(), st)
			}
			return nil
		}),
		timed("ssh", func(ctx context.Context) error {
			return countedRun(b.ssh.ssh(ctx, "bench-mux", "head -c "+fmt.Sprint(n)+" /dev/zero"), n)
		}),
		timed("pipe", func(ctx context.Context) error { return countedRun(exec.CommandContext(ctx, argv[0], argv[1:]...), n) }))
	if err != nil {
		return err
	}
	b.add(row{name: fmt.Sprintf("stream %s of stdout (attach)", sizeName(n)), unit: throughput(float64(n), "MB/s"),
		sidecar: s[0], peerName: "ssh, multiplexed", peer: s[1], floorName: "local pipe", floor: s[2]})
	return nil
}

// countedRun runs cmd reading its stdout to the end through a pipe, and checks it wrote
// exactly n bytes.
func countedRun(cmd *exec.Cmd, n int64) error {
	var c countingWriter
	cmd.Stdout = &c
	if err := runCmd(cmd); err != nil {
		return err
	}
	if c.n != n {
		return fmt.Errorf("%s wrote %d of %d bytes", cmd.Args[0], c.n, n)
	}
	return nil
}

type countingWriter struct{ n int64 }

func (c *countingWriter) Write(b []byte) (int, error) { c.n += int64(len(b)); return len(b), nil }
