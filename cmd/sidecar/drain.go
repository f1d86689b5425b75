package main

import (
	"context"
	"fmt"
	"os"
	"time"
)

func init() {
	register("drain", command{summary: "stop taking new leases (existing ones run to their end), or take them again",
		usage: "usage: sidecar drain [--undo] [--wait DURATION] [-o text|json]\n\nTells the daemon at SANDBOX_REMOTE_URL to refuse new leases (503 draining) while its\nleases run to their end; --undo takes new leases again. Prints the leases still active:\nat 0 the daemon can be stopped without losing one. --wait polls (every 2 s) until then,\nat most DURATION, and fails if leases remain (a Kubernetes preStop hook). Needs the\nshared token.",
		run:   runDrain})
}

func runDrain(ctx context.Context, args []string) error {
	fs := newFlagSet("drain")
	undo := fs.Bool("undo", false, "end the drain: take new leases again")
	wait := fs.Duration("wait", 0, "wait at most this long for the active leases to end")
	output := outputFlag(fs, "text", "json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("drain: unexpected argument %q", fs.Arg(0))
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	st, err := c.Drain(ctx, !*undo)
	if err != nil {
		return err
	}
	if *wait > 0 && !*undo {
		deadline := time.Now().Add(*wait)
		told := -1
		for st.ActiveLeases > 0 && time.Now().Before(deadline) {
			// Progress on stderr whenever the count moves: stdout keeps the one result line.
			if st.ActiveLeases != told {
				told = st.ActiveLeases
				fmt.Fprintf(os.Stderr, "sidecar: draining: waiting for %d active leases (at most %v more)\n",
					told, time.Until(deadline).Round(time.Second))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * time.Second): // a poll interval
			}
			if st, err = c.Drain(ctx, true); err != nil {
				return err
			}
		}
		if st.ActiveLeases > 0 {
			return fmt.Errorf("drain: %d leases still active after %v", st.ActiveLeases, *wait)
		}
	}
	if output.json() {
		return printJSON(os.Stdout, st)
	}
	state := "taking new leases"
	if st.Draining {
		state = "draining"
	}
	fmt.Printf("%s; %d leases active\n", state, st.ActiveLeases)
	return nil
}
