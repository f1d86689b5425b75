package main

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// Each tick writes one line with the soak's state at that tick; none after the end.
func TestProgressLines(t *testing.T) {
	ticks := make(chan time.Time)
	var out bytes.Buffer
	start := time.Unix(1_700_000_000, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		progressLines(ctx, ticks, &out, func(now time.Time) progress {
			rounds := 10 * int(now.Sub(start)/time.Minute) // the state at that tick
			return progress{elapsed: now.Sub(start), total: 30 * time.Minute, rounds: rounds, ops: 7 * rounds, errors: 1, rss: 40 << 20, peakRSS: 64 << 20}
		})
	}()
	for i := 1; i <= 2; i++ {
		ticks <- start.Add(time.Duration(i) * time.Minute)
	}
	cancel()
	<-done
	want := "sidecar-soak: 1m0s of 30m0s: 10 rounds, 70 operations, 1 errors; daemon RSS 40.0 MiB (peak 64.0 MiB)\n" +
		"sidecar-soak: 2m0s of 30m0s: 20 rounds, 140 operations, 1 errors; daemon RSS 40.0 MiB (peak 64.0 MiB)\n"
	if got := out.String(); got != want {
		t.Fatalf("progress:\n%s\nwant:\n%s", got, want)
	}
}
