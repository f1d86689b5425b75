package main

import (
	"context"
)

func init() {
	register("shell", command{summary: "open an interactive login shell in a lease", usage: shellUsage, run: runShell})
}

// shellScript prefers bash and falls back to sh; the lease's PATH decides which exist.
const shellUsage = "usage: sidecar shell [--cwd DIR] LEASE"

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
	return runStream(ctx, c.OpenLease(pos[0], ""), execArgs{
		interactive: true, tty: true, cwd: *cwd, lease: pos[0],
		argv: []string{"sh", "-c", shellScript},
	})
}
