package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Background processes, as docker's ps, logs and attach: `exec -d` starts one.

func init() {
	register("ps", command{summary: "list a lease's background processes (started by exec -d, shells)",
		usage: "usage: sidecar ps [-o table|json] LEASE", run: runPs})
	register("logs", command{summary: "print a background process's output (-f: follow it until it ends)",
		usage: logsUsage, run: runLogs})
	register("attach", command{summary: "attach to a background process's output (and stdin with -i)",
		usage: attachUsage, run: runAttach})
}

const logsUsage = `usage: sidecar logs [-f] LEASE PROC

Prints the output the daemon still holds for PROC (its replay buffer: the last
output_buffer_bytes of sidecar info), stdout and stderr to their own streams. -f keeps
following until the process ends and exits with its exit code.`

const attachUsage = `usage: sidecar attach [-i] LEASE PROC

Prints PROC's output from now on (its buffered output: sidecar logs) until it ends, then exits with its exit code; -i sends
this terminal's input to its stdin (a process started with exec -d -i or -t). A TTY
process puts this terminal in raw mode. Ctrl-C (without a TTY) detaches; the process
keeps running.`

func runPs(ctx context.Context, args []string) error {
	fs := newFlagSet("ps")
	output := outputFlag(fs, "table", "json")
	pos, err := operands(fs, args, 1, commands["ps"].usage)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	procs, err := c.OpenLease(pos[0], "").Processes(ctx)
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, apitype.ProcessList{Processes: append([]apitype.Process{}, procs...)})
	}
	return writeProcessTable(os.Stdout, procs, time.Now())
}

func writeProcessTable(w io.Writer, procs []apitype.Process, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROC\tSTATE\tEXIT\tSTARTED\tTTY\tOUTPUT\tCOMMAND")
	for _, p := range procs {
		exit := "-"
		switch {
		case p.ExitCode != nil:
			exit = fmt.Sprint(*p.ExitCode)
		case p.Signal != "":
			exit = p.Signal
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\t%s\n", p.PID, p.State, exit,
			strings.TrimPrefix(expiresIn(p.StartedAt, now), "in "), p.TTY, humanBytes(p.OutputOffset), strings.Join(p.Argv, " "))
	}
	return tw.Flush()
}

func runLogs(ctx context.Context, args []string) error {
	fs := newFlagSet("logs")
	follow := fs.Bool("f", false, "follow the output until the process ends; exit with its code")
	pos, err := operands(fs, args, 2, logsUsage)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	l := c.OpenLease(pos[0], "")
	proc, err := l.Process(ctx, pos[1])
	if err != nil {
		return err
	}
	p, err := l.Attach(ctx, pos[1], 0)
	if err != nil {
		return err
	}
	defer p.Close()
	if n := p.Lost(); n > 0 {
		fmt.Fprintf(os.Stderr, "sidecar: the first %d output bytes are no longer held by the daemon\n", n)
	}
	// Without -f, stop at the output the process had produced when we asked (an ended
	// process: all of it).
	until := int64(-1)
	if !*follow && proc.State == "running" {
		until = proc.OutputOffset
	}
	return copyOutput(ctx, p, until)
}

// copyOutput copies p's stdout and stderr to ours until p ends, or, with until ≥ 0, until
// the output offset until has been written; p's end is passed on as the exit code.
func copyOutput(ctx context.Context, p *client.Process, until int64) error {
	reached := make(chan struct{})
	var once sync.Once
	check := func() {
		if until >= 0 && p.Offset() >= until {
			once.Do(func() { close(reached) })
		}
	}
	check()
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(notifyWriter{os.Stdout, check}, p.Stdout) })
	wg.Go(func() { _, _ = io.Copy(notifyWriter{os.Stderr, check}, p.Stderr) })
	done := make(chan struct{})
	var st apitype.Status
	var err error
	go func() { st, err = p.Wait(ctx); close(done) }()
	select {
	case <-reached:
		return nil
	case <-done:
	}
	if errors.Is(err, context.Canceled) {
		return exitError{exitSignal + int(syscall.SIGINT)} // Ctrl-C; the process goes on
	}
	if err != nil {
		return err
	}
	wg.Wait()
	if n := p.Lost(); n > 0 {
		fmt.Fprintf(os.Stderr, "sidecar: %d output bytes lost (this reader fell behind the daemon's buffer)\n", n)
	}
	return exitFor(st.ExitCode, st.Signal, st.TimedOut)
}

// notifyWriter calls after once each write is done.
type notifyWriter struct {
	w     io.Writer
	after func()
}

func (n notifyWriter) Write(b []byte) (int, error) {
	k, err := n.w.Write(b)
	n.after()
	return k, err
}

func runAttach(ctx context.Context, args []string) error {
	fs := newFlagSet("attach")
	stdin := fs.Bool("i", false, "send this terminal's input to the process's stdin")
	pos, err := operands(fs, args, 2, attachUsage)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	l := c.OpenLease(pos[0], "")
	proc, err := l.Process(ctx, pos[1])
	if err != nil {
		return err
	}
	// From the output offset of the GET: what comes after it, without a gap.
	p, err := l.Attach(ctx, pos[1], proc.OutputOffset)
	if err != nil {
		return err
	}
	defer p.Close()
	stdinFd := int(os.Stdin.Fd())
	if proc.TTY && term.IsTerminal(stdinFd) {
		old, err := term.MakeRaw(stdinFd)
		if err != nil {
			return fmt.Errorf("raw terminal: %w", err)
		}
		defer term.Restore(stdinFd, old)
		if cols, rows, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
			_ = p.Resize(uint16(rows), uint16(cols))
		}
	}
	if *stdin {
		// Not closed at our EOF: the process may have other viewers, and it outlives us.
		go func() { _, _ = io.Copy(p.Stdin, os.Stdin) }()
	}
	err = copyOutput(ctx, p, -1)
	if ctx.Err() != nil {
		return nil // Ctrl-C detaches
	}
	return err
}
