package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func init() {
	register("shells", command{summary: "persistent shell sessions in a lease (new, ls, run, rm)",
		usage: shellsUsage, subs: []string{"new", "ls", "run", "rm"}, run: runShells})
}

const shellsUsage = `usage: sidecar shells new [--shell PATH] [--cwd DIR] [--env K=V]... [-o text|json] LEASE
       sidecar shells ls [-o table|json] LEASE
       sidecar shells run [--timeout 30s] [-o text|json] LEASE SESSION -- COMMAND...
       sidecar shells rm LEASE SESSION

A session keeps cd, export and background jobs from one run to the next (bash when the
lease has it, else sh). run prints the command's stdout and stderr and exits with its
exit code (124 when it timed out; the session stays usable). COMMAND's words are joined
by spaces and evaluated by the session's shell.`

func runShells(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, shellsUsage)
		return usageError{}
	}
	switch args[0] {
	case "new", "create":
		return shellsNew(ctx, args[1:])
	case "ls", "list":
		return shellsList(ctx, args[1:])
	case "run":
		return shellsRun(ctx, args[1:])
	case "rm", "close":
		return shellsRemove(ctx, args[1:])
	default:
		fmt.Fprintln(os.Stderr, shellsUsage)
		return usagef("shells: unknown subcommand %q", args[0])
	}
}

func shellsNew(ctx context.Context, args []string) error {
	fs := newFlagSet("shells new", "usage: sidecar shells new [--shell PATH] [--cwd DIR] [--env K=V]... [-o text|json] LEASE")
	var req apitype.ShellCreateRequest
	var env multiFlag
	fs.StringVar(&req.Shell, "shell", "", "absolute path of the shell inside the lease (default: bash if present, else /bin/sh)")
	fs.StringVar(&req.Cwd, "cwd", "", "`DIR` working directory, relative to the lease workdir")
	fs.Var(&env, "env", "`K=V` environment variable (repeatable)")
	output := outputFlag(fs, "text", "json")
	pos, err := operands(fs, args, 1, "usage: sidecar shells new [flags] LEASE")
	if err != nil {
		return err
	}
	if req.Env, err = keyValues(env, "--env"); err != nil {
		return usageError{err.Error()}
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	_, st, err := c.OpenLease(pos[0], "").NewShell(ctx, req)
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, st)
	}
	fmt.Println(st.ID)
	return nil
}

func shellsList(ctx context.Context, args []string) error {
	fs := newFlagSet("shells ls", "usage: sidecar shells ls [-o table|json] LEASE")
	output := outputFlag(fs, "table", "json")
	pos, err := operands(fs, args, 1, "usage: sidecar shells ls [-o table|json] LEASE")
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	list, err := c.OpenLease(pos[0], "").Shells(ctx)
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, apitype.ShellList{Shells: list})
	}
	return writeShellTable(os.Stdout, list)
}

func writeShellTable(w io.Writer, list []apitype.Shell) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSHELL\tBUSY\tCOMMANDS\tLAST EXIT\tCWD")
	for _, s := range list {
		last := "-"
		if s.LastExitCode != nil {
			last = fmt.Sprint(*s.LastExitCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%s\t%s\n", s.ID, s.Shell, s.Busy, s.Commands, last, s.Cwd)
	}
	return tw.Flush()
}

const shellsRunUsage = "usage: sidecar shells run [--timeout 30s] [-o text|json] LEASE SESSION -- COMMAND..."

// parseShellsRun reads flags before and between LEASE and SESSION and after SESSION; the
// command starts at "--" or at the first non-flag argument after SESSION (as exec's).
func parseShellsRun(args []string) (lease, session, command string, timeout time.Duration, json bool, err error) {
	fs := newFlagSet("shells run", shellsRunUsage)
	fs.DurationVar(&timeout, "timeout", 0, "interrupt the command after this long (0: none)")
	output := outputFlag(fs, "text", "json")
	var ids []string
	rest := args
	for len(ids) < 2 {
		if err = parseFlags(fs, rest); err != nil {
			return
		}
		if rest = fs.Args(); len(rest) == 0 {
			err = usageError{shellsRunUsage}
			return
		}
		ids, rest = append(ids, rest[0]), rest[1:]
	}
	lease, session = ids[0], ids[1]
	if err = parseFlags(fs, rest); err != nil {
		return
	}
	if rest = fs.Args(); len(rest) == 0 {
		err = usageError{shellsRunUsage}
		return
	}
	if timeout < 0 {
		err = usagef("--timeout %v: must not be negative", timeout)
		return
	}
	return lease, session, strings.Join(rest, " "), timeout, output.json(), nil
}

func shellsRun(ctx context.Context, args []string) error {
	lease, session, command, timeout, asJSON, err := parseShellsRun(args)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	res, err := c.OpenLease(lease, "").Shell(session).Run(ctx, command, timeout)
	if err != nil {
		return err
	}
	if asJSON {
		if err := printJSON(os.Stdout, res); err != nil {
			return err
		}
	} else {
		_, _ = io.WriteString(os.Stdout, res.Stdout)
		_, _ = io.WriteString(os.Stderr, res.Stderr)
	}
	noteTruncation(res.StdoutTruncated, res.StderrTruncated, res.StdoutDropped, res.StderrDropped)
	if res.Ended {
		fmt.Fprintln(os.Stderr, "sidecar: the shell exited; the session is closed")
	}
	return exitFor(res.ExitCode, res.Signal, res.TimedOut)
}

func shellsRemove(ctx context.Context, args []string) error {
	fs := newFlagSet("shells rm", "usage: sidecar shells rm LEASE SESSION")
	pos, err := operands(fs, args, 2, "usage: sidecar shells rm LEASE SESSION")
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	return c.OpenLease(pos[0], "").Shell(pos[1]).Close(ctx)
}
