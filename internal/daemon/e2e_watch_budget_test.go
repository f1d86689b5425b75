package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/fsxfer"
)

// A lease's watches cost the lease's share of the daemon's inotify budget, itself a
// quarter of the host's limits (issue 31): over them the daemon answers 429 watch_limit
// before the watch starts, and the host's limits are never reached. The budgets are
// the ones this host's /proc/sys/fs/inotify gives; the test holds at most a lease's
// share of them.
func TestWatchInotifyBudgetOfALease(t *testing.T) {
	hostInst, hostWatches := fsxfer.HostInotifyLimits()
	b, err := fsxfer.NewBudgets(fsxfer.BudgetConfig{})
	if err != nil {
		t.Fatal(err)
	}
	leaseInst, leaseWatches := b.LeaseInotify()
	if leaseInst*fsxfer.InotifyShare*fsxfer.LeaseInotifyShare > max(hostInst, fsxfer.InotifyShare*fsxfer.LeaseInotifyShare) ||
		leaseWatches*fsxfer.InotifyShare*fsxfer.LeaseInotifyShare > max(hostWatches, fsxfer.InotifyShare*fsxfer.LeaseInotifyShare) {
		t.Fatalf("a lease's share (%d instances, %d watches) is over a sixteenth of the host's (%d, %d)", leaseInst, leaseWatches, hostInst, hostWatches)
	}
	d := startDaemon(t)
	l := d.acquire("watch-budget")
	ctx := context.Background()
	dirs := min(leaseWatches, fsxfer.MaxWatchDirs-2)
	res := must(l.Exec(ctx, sh(fmt.Sprintf(`mkdir t && cd t && seq %d | xargs mkdir`, dirs))))(t)
	if res.ExitCode != 0 {
		t.Fatalf("mkdir: %+v", res)
	}
	// One watch of a directory, then a recursive one of the tree: its dirs+2 directories
	// (the lease's root, t and those below) are one over what the lease has left.
	first := must(l.Watch(ctx, "t/1", client.WatchOptions{}))(t)
	defer first.Close()
	_, err = l.Watch(ctx, "", client.WatchOptions{Recursive: true, MaxDirs: fsxfer.MaxWatchDirs})
	var apiErr *client.APIError
	if leaseWatches <= fsxfer.MaxWatchDirs-2 {
		if !errors.Is(err, client.ErrWatchLimit) || !errors.As(err, &apiErr) || apiErr.Status != 429 || !strings.Contains(apiErr.Detail, "lease") {
			t.Fatalf("a recursive watch over the lease's watches: %v, want 429 watch_limit naming the lease", err)
		}
	}
	// Instances: the lease's share of watches at once, then 429 watch_limit.
	ws := []*client.Watcher{first}
	for len(ws) < leaseInst {
		w, err := l.Watch(ctx, "t", client.WatchOptions{})
		if err != nil {
			t.Fatalf("watch %d of the lease's %d: %v", len(ws)+1, leaseInst, err)
		}
		defer w.Close()
		ws = append(ws, w)
	}
	if _, err := l.Watch(ctx, "t", client.WatchOptions{}); !errors.Is(err, client.ErrWatchLimit) {
		t.Fatalf("a watch over the lease's %d: %v, want watch_limit", leaseInst, err)
	}
	// A watch ended is given back.
	ws[len(ws)-1].Close()
	waitFor(t, "a closed watch to be given back", 10*time.Second, func() bool {
		w, err := l.Watch(ctx, "t", client.WatchOptions{})
		if err == nil {
			w.Close()
		}
		return err == nil
	})
}
