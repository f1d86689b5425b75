package main

import (
	"context"
	"fmt"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
	"log/slog"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
)

// bench is one run: what it started, and the rows it measured.
type bench struct {
	log   *slog.Logger
	dir   string // temporary root under /var/tmp, removed at the end
	sz    sizes
	quick bool
	http1 bool // the client was forced to HTTP/1.1
	d     *daemon
	c     *client.Client
	ssh   *sshd
	envd  *envd // nil without -envd

	rows          []row
	notes         []string // lines under the table (load results, caveats)
	failures      []string
	machineBefore machine
	daemonStatus  daemontest.ProcStatus
}

// contender is one way of doing a case's job; run does it once and returns the time the
// job took (setup and cleanup it does outside that time are not counted).
type contender struct {
	name string
	run  func(ctx context.Context) (time.Duration, error)
}

// timed wraps a job whose whole run is the measurement.
func timed(name string, f func(ctx context.Context) error) contender {
	return contender{name: name, run: func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		err := f(ctx)
		return time.Since(start), err
	}}
}

// interleave runs warmup unmeasured rounds, then reps measured rounds, each round running
// every contender once in turn, so a machine that gets busier slows all of them alike.
// The first error stops it.
func interleave(ctx context.Context, warmup, reps int, cs ...contender) ([]samples, error) {
	out := make([]samples, len(cs))
	for i := range warmup + reps {
		for j, c := range cs {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			d, err := c.run(ctx)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", c.name, err)
			}
			if i >= warmup {
				out[j] = append(out[j], d)
			}
		}
	}
	return out, nil
}

// row is one line of the table. A nil peer or floor shows as "—".
type row struct {
	name      string
	unit      unit
	sidecar   samples
	peerName  string
	peer      samples
	floorName string
	floor     samples
}

func (b *bench) add(r row) {
	b.rows = append(b.rows, r)
	args := []any{"case", r.name}
	for _, c := range []struct {
		name string
		s    samples
	}{{"sidecar", r.sidecar}, {r.peerName, r.peer}, {r.floorName, r.floor}} {
		if len(c.s) > 0 {
			args = append(args, c.name, r.unit.format(c.s.median()))
		}
	}
	b.log.Info("measured", args...)
}

func (b *bench) note(format string, args ...any) {
	b.notes = append(b.notes, fmt.Sprintf(format, args...))
}
