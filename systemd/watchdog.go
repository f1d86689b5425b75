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

// RunWatchdog pings the watchdog (WATCHDOG=1) at once and then at half its interval, each
// time only if healthy() says so, until ctx is done. Withheld pings are the point: an
// unhealthy or stuck daemon is killed and restarted by systemd. It returns at once when
// there is no watchdog. A failed send is logged and retried on the next tick; if sends
// keep failing, systemd's timeout restarts the daemon, the right outcome for a daemon that
// cannot reach its supervisor. logger may be nil.
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
	wasHealthy := true
	for {
		ok := healthy()
		switch {
		case !ok && wasHealthy:
			logger.Warn("unhealthy: withholding systemd watchdog pings", "watchdog", interval)
		case ok && !wasHealthy:
			logger.Info("healthy again: resuming systemd watchdog pings")
		}
		wasHealthy = ok
		if ok {
			if _, err := Notify("WATCHDOG=1"); err != nil {
				logger.Warn("systemd watchdog ping failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
