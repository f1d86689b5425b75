// Command sidecar is the remote sandbox daemon and its operator CLI in one binary.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand: its own flag set lives in its run function.
type command struct {
	summary string
	usage   string   // what `sidecar CMD --help` prints; the summary when empty
	subs    []string // subcommands (`leases ls`, …), for completion and the --help test
	run     func(ctx context.Context, args []string) error
	hidden  bool
}

// commands is filled by each subcommand's file in an init function, so that adding a
// subcommand touches one file.
var commands = map[string]command{}

func register(name string, c command) { commands[name] = c }

// exitError carries a process exit code through to main (e.g. `sidecar exec` passes the
// remote exit code on).
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	var ee exitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		os.Exit(ee.code)
	case errors.Is(err, flag.ErrHelp):
		// An explicit -h/--help: the flag set printed its usage.
	case isUsageError(err):
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, "sidecar:", msg)
		}
		os.Exit(exitUsage)
	default:
		fmt.Fprintln(os.Stderr, "sidecar:", err)
		os.Exit(exitFailure)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		usage(os.Stderr)
		return usageError{}
	}
	if isHelpArg(args[0]) {
		if len(args) > 1 && commands[args[1]].run != nil { // sidecar help CMD
			commandUsage(args[1])
			return nil
		}
		usage(os.Stdout)
		return nil
	}
	c, ok := commands[args[0]]
	if !ok {
		usage(os.Stderr)
		return usagef("unknown command %q", args[0])
	}
	if len(args) > 1 && isHelpArg(args[1]) {
		commandUsage(args[0])
		return nil
	}
	return c.run(ctx, args[1:])
}

func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for name, c := range commands {
		if !c.hidden {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: sidecar <command> [arguments]\n\ncommands:")
	for _, name := range names {
		fmt.Fprintf(w, "  %-10s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w, "\n`sidecar COMMAND --help` describes one; exit codes: 0 done, 1 failed, 2 bad usage.")
}
