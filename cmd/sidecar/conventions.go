package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Exit codes of the CLI besides 0 (docs/operations.md lists them). exec and shell pass
// the remote command's own code through, 124 for a timeout and 128+N for signal N.
const (
	exitFailure = 1 // the daemon refused, the network failed, a file could not be read
	exitUsage   = 2 // the command line is wrong: unknown command, flag or -o value
)

// usageError is a command line the command cannot run; it exits with exitUsage.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

func isUsageError(err error) bool {
	var ue usageError
	return errors.As(err, &ue)
}

func isHelpArg(a string) bool { return a == "-h" || a == "-help" || a == "--help" || a == "help" }

// commandUsage prints `sidecar NAME --help`.
func commandUsage(name string) {
	c := commands[name]
	text := c.usage
	if text == "" {
		text = "usage: sidecar " + name + "\n\n" + c.summary
	}
	fmt.Fprintln(os.Stdout, strings.TrimRight(text, "\n"))
}

// parseFlags is fs.Parse with a bad flag reported as a usage error (the flags listed
// on stderr) and -h answered on stdout, returning flag.ErrHelp (exit 0).
func parseFlags(fs *flag.FlagSet, args []string) error {
	usage := fs.Usage
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(expandBundles(fs, args))
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		flagUsage(fs, os.Stdout)
	case err != nil:
		fmt.Fprintln(os.Stderr, "sidecar:", err)
		flagUsage(fs, os.Stderr)
		return usageError{}
	}
	return err
}

// flagUsage prints a flag set's usage (its own, or the flag package's list of flags).
func flagUsage(fs *flag.FlagSet, w io.Writer) {
	fs.SetOutput(w)
	defer fs.SetOutput(io.Discard)
	fs.Usage()
}

// outputFormat is the -o flag, checked while parsing so that a typo is a usage error
// instead of silently printing the default format.
type outputFormat struct {
	value   string
	allowed []string
}

func (o *outputFormat) String() string { return o.value }

func (o *outputFormat) Set(v string) error {
	if !slices.Contains(o.allowed, v) {
		return fmt.Errorf("want %s", strings.Join(o.allowed, " or "))
	}
	o.value = v
	return nil
}

func (o *outputFormat) json() bool { return o.value == "json" }

// outputFlag adds -o to fs; the first allowed format is the default.
func outputFlag(fs *flag.FlagSet, allowed ...string) *outputFormat {
	o := &outputFormat{value: allowed[0], allowed: allowed}
	fs.Var(o, "o", "`FORMAT` output format: "+strings.Join(allowed, " or "))
	return o
}
