package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/creack/pty"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// echoScript puts the terminal in raw mode (so every byte reaches cat at once and comes
// back unchanged), says it is ready, and echoes.
const echoScript = "stty raw -echo && printf R && exec cat"

// echoer is one terminal running echoScript: one byte in, the same byte out.
type echoer struct {
	name string
	w    io.Writer
	r    io.Reader
	stop func()
}

// roundTrip writes one byte and reads it back.
func (e *echoer) roundTrip() (time.Duration, error) {
	b := []byte{'a'}
	start := time.Now()
	if _, err := e.w.Write(b); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(e.r, b); err != nil {
		return 0, err
	}
	d := time.Since(start)
	if b[0] != 'a' {
		return 0, fmt.Errorf("%s echoed %q", e.name, b)
	}
	return d, nil
}

// ready waits for the R echoScript prints once the terminal is raw.
func (e *echoer) ready() error {
	b := make([]byte, 1)
	for {
		if _, err := io.ReadFull(e.r, b); err != nil {
			return fmt.Errorf("%s: no ready mark: %w", e.name, err)
		}
		if b[0] == 'R' {
			return nil
		}
	}
}

// casePTY: one-byte echo round trips through a terminal: sidecar ExecStream with a TTY,
// ssh -tt over the multiplexed connection, and a local PTY.
func (b *bench) casePTY(ctx context.Context) error {
	l, err := b.acquire(ctx, apitype.Limits{})
	if err != nil {
		return err
	}
	defer l.Release(context.WithoutCancel(ctx))
	var es []*echoer
	defer func() {
		for _, e := range es {
			e.stop()
		}
	}()
	p, err := l.ExecStream(ctx, client.ExecStreamRequest{Argv: []string{"sh", "-c", echoScript}, TTY: true, Stdin: true, Rows: 24, Cols: 80})
	if err != nil {
		return err
	}
	es = append(es, &echoer{name: "sidecar", w: p.Stdin, r: p.Stdout, stop: func() { p.Close() }})

	sshCmd := b.ssh.sshWith(ctx, []string{"-tt"}, "bench-mux", echoScript)
	in, err := sshCmd.StdinPipe()
	if err != nil {
		return err
	}
	out, err := sshCmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := sshCmd.Start(); err != nil {
		return err
	}
	es = append(es, &echoer{name: "ssh -tt", w: in, r: out, stop: func() { in.Close(); _ = sshCmd.Process.Kill(); _ = sshCmd.Wait() }})

	local := exec.Command("sh", "-c", echoScript)
	master, err := pty.Start(local)
	if err != nil {
		return err
	}
	es = append(es, &echoer{name: "local pty", w: master, r: master, stop: func() {
		_ = local.Process.Kill()
		_ = local.Wait()
		master.Close()
	}})

	for _, e := range es {
		if err := withDeadline(ctx, 30*time.Second, e.ready); err != nil {
			return err
		}
	}
	cs := make([]contender, len(es))
	for i, e := range es {
		cs[i] = contender{name: e.name, run: func(context.Context) (time.Duration, error) { return e.roundTrip() }}
	}
	s, err := interleave(ctx, 10, b.sz.ptyRounds, cs...)
	if err != nil {
		return err
	}
	b.add(row{name: "PTY echo round trip, 1 byte", unit: latency, sidecar: s[0],
		peerName: "`ssh -tt`, multiplexed", peer: s[1], floorName: "local PTY", floor: s[2]})
	return nil
}

// withDeadline runs f, giving up (with an error; f's goroutine is left to the cleanup
// that closes its streams) when it takes longer than d.
func withDeadline(ctx context.Context, d time.Duration, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return errors.New("timed out waiting for the terminal")
	case <-ctx.Done():
		return ctx.Err()
	}
}
