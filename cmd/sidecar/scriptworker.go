package main

import (
	"context"

	"github.com/sidecar-sandbox/sidecar/internal/script"
)

// The script worker is the daemon's own binary run by script.Runner: hidden, because only
// the daemon starts it.
func init() {
	register("__script-worker", command{
		summary: "serve QuickJS scripts for the daemon over stdin/stdout (internal)",
		hidden:  true,
		run: func(context.Context, []string) error {
			script.WorkerMain()
			return nil
		},
	})
}
