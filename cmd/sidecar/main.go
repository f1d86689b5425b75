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
	"runtime"
	"sort"
	"strings"
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

// The main goroutine keeps the main thread: a goroutine that made a namespace on a locked
// thread and could not switch back ends with its thread, which must never be the main one
// (the runtime keeps it alive, and /proc/self shows its namespaces).
func init() { runtime.LockOSThread() }

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
			fmt.Fprintln(os.Stderr, errorLine(err))
		}
		os.Exit(exitUsage)
	default:
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(exitFailure)
	}
}

// errorLine is err for stderr with one "sidecar:" in front: the client's errors carry
// their own (a daemon's reply reads "sidecar: lease not found: …"), also when wrapped.
func errorLine(err error) string {
	msg := strings.ReplaceAll(err.Error(), ": sidecar: ", ": ")
	for {
		rest, ok := strings.CutPrefix(msg, "sidecar: ")
		if !ok {
			return "sidecar: " + msg
		}
		msg = rest
	}
}

func run(ctx context.Context, args []string) error {
	args, err := parseGlobalFlags(args)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		usage(os.Stderr)
		return usageError{}
	}
	if isHelpArg(args[0]) {
		if len(args) > 1 && commands[args[1]].run != nil { // sidecar help CMD
			return commandHelp(ctx, args[1])
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
		return commandHelp(ctx, args[0])
	}
	return c.run(ctx, args[1:])
}

// commandHelp prints `sidecar NAME --help`: a command with subcommands prints its usage
// (`sidecar NAME SUB --help` lists SUB's flags); any other lets its flag set print the
// usage and every flag (commands parse their flags before they do anything).
func commandHelp(ctx context.Context, name string) error {
	c := commands[name]
	if len(c.subs) > 0 || c.hidden {
		commandUsage(name)
		return nil
	}
	return c.run(ctx, []string{"--help"})
}

// parseGlobalFlags takes --url and --context (with "=" or a separate value) off the
// front of args, before the command name.
func parseGlobalFlags(args []string) ([]string, error) {
	for len(args) > 0 {
		name, value, hasValue := strings.Cut(strings.TrimLeft(args[0], "-"), "=")
		if !strings.HasPrefix(args[0], "-") || (name != "url" && name != "context") {
			return args, nil
		}
		args = args[1:]
		if !hasValue {
			if len(args) == 0 {
				return nil, usagef("flag needs an argument: --%s", name)
			}
			value, args = args[0], args[1:]
		}
		if name == "url" {
			globals.url = value
		} else {
			globals.context = value
		}
	}
	return args, nil
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
	fmt.Fprintln(w, `
global flags (before the command or among its flags):
  --url URL       the daemon's https:// URL
  --context NAME  a named daemon (sidecar context add|use|ls)

`+"`sidecar COMMAND --help`"+` describes one; exit codes: 0 done, 1 failed, 2 bad usage.`)
}
