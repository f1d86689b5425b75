package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func init() {
	register("exec", command{summary: "run a command in a lease, its output streamed (-it: interactive, -d: in the background)",
		usage: execUsage + `

Streams the command's stdout and stderr as they come, every byte in order (the command
waits for this reader rather than lose output). -i sends stdin, -t allocates a terminal;
-d starts a background process and prints its id for ps, logs and attach. sidecar's flags
come before the command: the command starts at -- or at the first argument after LEASE
that is not a flag, so "exec L ls -l" passes -l to ls.

The exit code is the command's own; 124 when it timed out, 128+N when signal N ended it.`,
		run: runExec})
}

// Exit codes for outcomes that have no exit status of their own, as timeout(1) and
// shells report them.
const (
	exitTimedOut = 124
	exitSignal   = 128
)

// execArgs are the parsed arguments of `sidecar exec`.
type execArgs struct {
	interactive, tty bool
	detach           bool
	lossless         bool
	cwd              string
	env              map[string]string
	timeout          time.Duration
	lease            string
	argv             []string
}

const execUsage = "usage: sidecar exec [-i] [-t] [-d] [--cwd DIR] [--env K=V]... [--timeout 30s] LEASE [--] COMMAND [ARGS]"

// parseExec reads sidecar's flags before and after LEASE; the command starts at "--" or
// at the first argument after LEASE that is not a flag (docker's rule), so the command's
// own flags stay its own: `exec -it L sh`, `exec L -t -- sh -c x`, `exec L ls -l`.
func parseExec(args []string) (execArgs, error) {
	fs := newFlagSet("exec")
	var a execArgs
	var env multiFlag
	fs.BoolVar(&a.interactive, "i", false, "attach stdin")
	fs.BoolVar(&a.tty, "t", false, "allocate a terminal")
	fs.BoolVar(&a.detach, "d", false, "start a background process and print its id (see ps, logs, attach)")
	fs.BoolVar(&a.lossless, "lossless", true, "every output byte, the command slowed to this reader (the default; --lossless=false drops what a slow reader misses)")
	fs.StringVar(&a.cwd, "cwd", "", "`DIR` working directory, relative to the lease workdir")
	fs.Var(&env, "env", "`K=V` environment variable (repeatable)")
	fs.DurationVar(&a.timeout, "timeout", 0, "kill the command after this long (0: no limit but the lease's)")
	if err := parseFlags(fs, args); err != nil {
		return a, err
	}
	rest := fs.Args()
	if len(rest) < 2 {
		return a, usageError{execUsage}
	}
	a.lease = rest[0]
	// fs.Parse stops at the first non-flag argument and consumes one "--".
	if err := parseFlags(fs, rest[1:]); err != nil {
		return a, err
	}
	a.argv = fs.Args()
	if len(a.argv) == 0 {
		return a, usageError{execUsage}
	}
	if a.timeout < 0 {
		return a, usagef("--timeout %v: must not be negative", a.timeout)
	}
	var err error
	if a.env, err = keyValues(env, "--env"); err != nil {
		return a, usageError{err.Error()}
	}
	return a, nil
}

func runExec(ctx context.Context, args []string) error {
	a, err := parseExec(args)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	l := c.OpenLease(a.lease, "")
	if a.detach {
		return startDetached(ctx, l, a)
	}
	return runStream(ctx, l, a)
}

// startDetached starts a as a background process and prints its id.
func startDetached(ctx context.Context, l *client.Lease, a execArgs) error {
	p, err := l.Start(ctx, apitype.StartRequest{Argv: a.argv, Env: a.env, Cwd: a.cwd, TTY: a.tty,
		Stdin: a.interactive, TimeoutSeconds: a.timeout.Seconds()})
	if err != nil {
		return err
	}
	_ = p.Close() // a background process outlives its viewers
	fmt.Println(p.ID())
	return nil
}

// noteTruncation tells stderr what the daemon dropped of a run's output, if anything.
func noteTruncation(stdoutTruncated, stderrTruncated bool, stdoutDropped, stderrDropped int64) {
	for _, s := range []struct {
		name      string
		truncated bool
		dropped   int64
	}{{"stdout", stdoutTruncated, stdoutDropped}, {"stderr", stderrTruncated, stderrDropped}} {
		switch {
		case s.dropped > 0:
			fmt.Fprintf(os.Stderr, "sidecar: %s over the daemon's limit: %d bytes dropped between its head and its end\n", s.name, s.dropped)
		case s.truncated:
			fmt.Fprintf(os.Stderr, "sidecar: %s truncated: output was lost before the daemon kept it\n", s.name)
		}
	}
}

// exitFor passes a remote outcome on as this process's exit code.
func exitFor(code int, sig string, timedOut bool) error {
	switch {
	case timedOut:
		fmt.Fprintln(os.Stderr, "sidecar: command timed out")
		return exitError{exitTimedOut}
	case sig != "":
		n := unix.SignalNum("SIG" + strings.TrimPrefix(strings.ToUpper(sig), "SIG"))
		if n == 0 {
			return exitError{exitSignal + int(unix.SIGKILL)}
		}
		return exitError{exitSignal + int(n)}
	case code != 0:
		return exitError{code}
	}
	return nil
}

// runStream runs a over the exec websocket: stdin forwarded with -i, a raw local terminal
// and SIGWINCH resizes with -t, every output byte with --lossless. With -i and -t a
// person is attached: the lease is renewed while the command runs, and if the lease
// ends under it, stderr says so.
func runStream(ctx context.Context, l *client.Lease, a execArgs) error {
	if !a.interactive || !a.tty {
		return stream(ctx, l, a)
	}
	k := keepLease(ctx, l)
	err := stream(ctx, l, a)
	k.Stop()
	if why := k.ended(context.WithoutCancel(ctx)); why != "" {
		fmt.Fprintln(os.Stderr, "sidecar:", why)
	}
	return err
}

func stream(ctx context.Context, l *client.Lease, a execArgs) error {
	req := client.ExecStreamRequest{Argv: a.argv, Env: a.env, Cwd: a.cwd, TTY: a.tty, Stdin: a.interactive,
		TimeoutSeconds: a.timeout.Seconds(), Lossless: a.lossless}
	stdinFd, stdoutFd := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	localTTY := a.tty && term.IsTerminal(stdinFd)
	if a.tty && term.IsTerminal(stdoutFd) {
		if cols, rows, err := term.GetSize(stdoutFd); err == nil {
			req.Rows, req.Cols = uint16(rows), uint16(cols)
		}
	}
	p, err := l.ExecStream(ctx, req)
	if err != nil {
		return err
	}
	defer p.Close()
	if localTTY {
		old, err := term.MakeRaw(stdinFd)
		if err != nil {
			return fmt.Errorf("raw terminal: %w", err)
		}
		defer term.Restore(stdinFd, old)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				if cols, rows, err := term.GetSize(stdoutFd); err == nil {
					_ = p.Resize(uint16(rows), uint16(cols))
				}
			}
		}()
	}
	if a.interactive {
		go func() {
			_, _ = io.Copy(p.Stdin, os.Stdin)
			if a.tty && !localTTY {
				// A terminal has no end of input but the EOF character: what a reader
				// of the remote terminal needs to see the piped input end.
				_, _ = p.Stdin.Write([]byte{4})
			}
			_ = p.Stdin.Close()
		}()
	}
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(os.Stdout, p.Stdout) })
	wg.Go(func() { _, _ = io.Copy(os.Stderr, p.Stderr) })
	st, err := p.Wait(ctx)
	if errors.Is(err, context.Canceled) {
		// Ctrl-C: closing the stream ends the command, as a shell's would; exit as it does.
		return exitError{exitSignal + int(unix.SIGINT)}
	}
	if err != nil {
		return err
	}
	wg.Wait()
	if n := p.Lost(); n > 0 {
		fmt.Fprintf(os.Stderr, "sidecar: %d output bytes lost (the reader fell behind the daemon's buffer; --lossless slows the command instead)\n", n)
	}
	return exitFor(st.ExitCode, st.Signal, st.TimedOut)
}
