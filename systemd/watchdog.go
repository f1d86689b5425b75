package systemd

import (
	"context"
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
// unhealthy or stuck daemon is killed and restarted by systemd, so healthy() should log why
// it says no. It returns at once when there is no watchdog. A failed send is retried on
// the next tick; if sends keep failing, systemd's timeout restarts the daemon, which is
// the right outcome for a daemon that cannot reach its supervisor.
func RunWatchdog(ctx context.Context, healthy func() bool) {
	interval, ok := WatchdogInterval()
	if !ok {
		return
	}
	tick := time.NewTicker(interval / 2)
	defer tick.Stop()
	for {
		if healthy() {
			_, _ = Notify("WATCHDOG=1")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
