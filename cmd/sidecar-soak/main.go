// Command sidecar-soak is the long soak of the sidecar daemon: many leases acquiring,
// running, transferring and releasing at once for a long time, then an account of
// errors, latency, memory and anything left behind.
//
// By default it starts the built daemon (-bin) on a loopback port with a state dir
// under /var/tmp and its own cgroup parent, and removes them at the end. With
// SANDBOX_REMOTE_URL set it drives that daemon instead (SANDBOX_* client variables);
// host-side leak checks are then limited to what the API and /metrics show.
//
//	sidecar-soak -leases 32 -duration 30m
//
// The exit status is 0 only with zero errors and zero leaked resources.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	os.Exit(run())
}

func run() int {
	var o options
	flag.IntVar(&o.leases, "leases", 16, "leases at once (one worker each)")
	flag.DurationVar(&o.duration, "duration", 5*time.Minute, "how long the load runs")
	flag.StringVar(&o.bin, "bin", "bin/sidecar", "daemon binary to start when SANDBOX_REMOTE_URL is not set")
	flag.IntVar(&o.payload, "payload-kib", 512, "size of each file written, uploaded and read back, in KiB")
	flag.BoolVar(&o.verbose, "v", false, "log every failure and the daemon's stderr")
	flag.DurationVar(&o.progress, "progress", time.Minute, "print a progress line to stderr this often while the load runs; 0: none")
	flag.Parse()
	if o.leases < 1 || o.duration <= 0 || o.payload < 1 || o.progress < 0 {
		fmt.Fprintln(os.Stderr, "sidecar-soak: -leases, -duration and -payload-kib must be positive, -progress not negative")
		return 2
	}
	level := slog.LevelWarn
	if o.verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	target, err := openTarget(ctx, o, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar-soak:", err)
		return 1
	}
	defer target.close()

	rep, err := soak(ctx, target, o, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar-soak:", err)
		return 1
	}
	rep.print(os.Stdout)
	if rep.errors > 0 || rep.leaked() > 0 {
		return 1
	}
	return 0
}

type options struct {
	leases   int
	duration time.Duration
	bin      string
	payload  int
	verbose  bool
	progress time.Duration
}
