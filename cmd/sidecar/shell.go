package main

import (
	"context"
	"os"
)

func init() {
	register("shell", command{summary: "open an interactive login shell in a lease", usage: shellUsage, run: runShell})
}

// shellScript prefers bash and falls back to sh; the lease's PATH decides which exist.
const shellUsage = `usage: sidecar shell [--cwd DIR] LEASE

Opens a login shell (bash, else sh) in a terminal in the lease, renewing the lease while
it runs; if the lease ends under it (expired, released), says so. Without a terminal on
stdin the shell reads its commands from stdin and ends at its end, as ssh does.`

const shellScript = `if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi`

func runShell(ctx context.Context, args []string) error {
	fs := newFlagSet("shell")
	cwd := fs.String("cwd", "", "`DIR` working directory, relative to the lease workdir")
	pos, err := operands(fs, args, 1, shellUsage)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	// As ssh: a terminal only for a terminal. Piped input is read by a shell without one
	// and ends the session at its end (sidecar shell L <script.sh, </dev/null).
	return runStream(ctx, c.OpenLease(pos[0], ""), execArgs{
		interactive: true, tty: isTerminal(os.Stdin), cwd: *cwd, lease: pos[0],
		argv: []string{"sh", "-c", shellScript},
	})
}
