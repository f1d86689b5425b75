package systemd

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"time"
)

// WatchdogInterval returns the watchdog timeout systemd set for this process (WatchdogSec=),
// from $WATCHDOG_USEC; ok is false when there is none or it is meant for another process
// ($WATCHDOG_PID).
func WatchdogInterval() (d time.Duration, ok bool) {
	usec, err := strconv.ParseUint(os.Getenv("WATCHDOG_USEC"), 10, 63)
	if err != nil || usec == 0 || usec > uint64(time.Duration(1<<63-1)/time.Microsecond) {
		return 0, false
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" && pid != strconv.Itoa(os.Getpid()) {
		return 0, false
	}
	return time.Duration(usec) * time.Microsecond, true
}

// RunWatchdog pings the watchdog (WATCHDOG=1) at half its interval, each time only if
// healthy() says so, until ctx is done. Missing pings are the point: an unhealthy or stuck
// daemon is killed and restarted by systemd. It returns at once when there is no watchdog.
// Failed sends are logged and retried on the next tick; if they persist, systemd's timeout
// does the rest.
func RunWatchdog(ctx context.Context, healthy func() bool, logger *slog.Logger) {
	interval, ok := WatchdogInterval()
	if !ok {
		return
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tick := time.NewTicker(interval / 2)
	defer tick.Stop()
	for {
		if !healthy() {
			logger.Warn("unhealthy: withholding the systemd watchdog ping", "watchdog", interval)
		} else if _, err := Notify("WATCHDOG=1"); err != nil {
			logger.Warn("systemd watchdog ping failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
