package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"

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
	var delivered, dropped int64
	s, err := interleave(ctx, 1, b.sz.bigReps,
		contender{name: "sidecar", run: func(ctx context.Context) (time.Duration, error) {
			start := time.Now()
			got, lost, err := streamOnce(ctx, l, argv, false)
			d := time.Since(start)
			if err == nil && got+lost != n {
				err = fmt.Errorf("read %d and lost %d of %d bytes", got, lost, n)
			}
			if err != nil || got == 0 {
				return d, err
			}
			delivered += got
			dropped += lost
			// The daemon never blocks a process on a lossy viewer (docs/api.md): a reader that
			// falls behind loses bytes. Scale the time to what delivering all n bytes at the
			// same rate would take, so the row shows bytes actually delivered per second.
			return time.Duration(float64(d) * float64(n) / float64(got)), nil
		}},
		timed("ssh", func(ctx context.Context) error {
			return countedRun(b.ssh.ssh(ctx, "bench-mux", "head -c "+fmt.Sprint(n)+" /dev/zero"), n)
		}),
		timed("pipe", func(ctx context.Context) error { return countedRun(exec.CommandContext(ctx, argv[0], argv[1:]...), n) }))
	if err != nil {
		return err
	}
	if dropped > 0 {
		b.note("stream: the attach dropped %.1f%% of the output (%d of %d bytes, counted in bytes_lost): the daemon "+
			"never blocks a process on a slow lossy viewer, so `head` outran the reader; the row counts delivered bytes only, "+
			"while ssh is lossless and backpressures `head`.", 100*float64(dropped)/float64(delivered+dropped), dropped, delivered+dropped)
	}
	b.add(row{name: fmt.Sprintf("stream %s of stdout (Start + attach, delivered)", sizeName(n)), unit: throughput(float64(n), "MB/s"),
		sidecar: s[0], peerName: "ssh, multiplexed", peer: s[1], floorName: "local pipe", floor: s[2]})

	// Lossless: the process waits for the reader (backpressure, as ssh does), so every
	// byte arrives and the row is plain bytes over time.
	var losslessLost int64
	s, err = interleave(ctx, 1, b.sz.bigReps,
		timed("sidecar", func(ctx context.Context) error {
			got, lost, err := streamOnce(ctx, l, argv, true)
			if err == nil && got != n {
				err = fmt.Errorf("lossless: read %d of %d bytes (lost %d)", got, n, lost)
			}
			losslessLost += lost
			return err
		}),
		timed("ssh", func(ctx context.Context) error {
			return countedRun(b.ssh.ssh(ctx, "bench-mux", "head -c "+fmt.Sprint(n)+" /dev/zero"), n)
		}),
		timed("pipe", func(ctx context.Context) error { return countedRun(exec.CommandContext(ctx, argv[0], argv[1:]...), n) }))
	if err != nil {
		return err
	}
	b.note("stream, lossless: %d bytes lost over %d runs (must be 0).", losslessLost, b.sz.bigReps)
	b.add(row{name: fmt.Sprintf("stream %s of stdout (Start + lossless attach)", sizeName(n)), unit: throughput(float64(n), "MB/s"),
		sidecar: s[0], peerName: "ssh, multiplexed", peer: s[1], floorName: "local pipe", floor: s[2]})
	return nil
}

// streamOnce starts argv in the lease (lossless: held for the attach), reads its stdout
// and stderr to the end and returns how many stdout bytes arrived and how many the attach
// lost.
func streamOnce(ctx context.Context, l *client.Lease, argv []string, lossless bool) (got, lost int64, err error) {
	p, err := l.Start(ctx, apitype.StartRequest{Argv: argv, Lossless: lossless})
	if err != nil {
		return 0, 0, err
	}
	defer p.Close()
	errc := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, p.Stderr); errc <- err }()
	if got, err = io.Copy(io.Discard, p.Stdout); err != nil {
		return got, 0, err
	}
	if err := <-errc; err != nil {
		return got, 0, err
	}
	st, err := p.Wait(ctx)
	if err != nil {
		return got, 0, err
	}
	if st.ExitCode != 0 || st.Signal != "" {
		return got, 0, fmt.Errorf("%v ended %+v", argv, st)
	}
	return got, p.Lost(), nil
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
