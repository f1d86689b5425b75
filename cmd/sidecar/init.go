package main

import (
	"context"

	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
)

// The sandbox starts every lease process as `sidecar __sandbox-init` (unless a smaller
// sidecar-init binary sits next to this one); the helper reads its parameters from fd 3,
// never from the daemon's configuration.
func init() {
	register(sandbox.HelperArg, command{
		summary: "internal: start a lease process inside its sandbox",
		hidden:  true,
		run: func(context.Context, []string) error {
			sandbox.InitMain()
			return nil // not reached: InitMain execs the target or exits
		},
	})
}
