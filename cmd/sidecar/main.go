// Command sidecar is the remote sandbox daemon and its operator CLI in one binary.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand: its own flag set lives in its run function.
type command struct {
	summary string
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
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "sidecar:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		if len(args) == 0 {
			return flag.ErrHelp
		}
		return nil
	}
	c, ok := commands[args[0]]
	if !ok {
		usage()
		return fmt.Errorf("unknown command %q", args[0])
	}
	return c.run(ctx, args[1:])
}

func usage() {
	names := make([]string, 0, len(commands))
	for name, c := range commands {
		if !c.hidden {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	fmt.Fprintln(os.Stderr, "usage: sidecar <command> [arguments]\n\ncommands:")
	for _, name := range names {
		fmt.Fprintf(os.Stderr, "  %-9s %s\n", name, commands[name].summary)
	}
}
