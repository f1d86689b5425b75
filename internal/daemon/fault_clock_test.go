package daemon_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// Clock jumps around lease expiry, with the daemon's injected clock: forward past
// expiry and back, renew at the edge, and a clock that goes backwards.

func TestFaultClockJumps(t *testing.T) {
	ctx := context.Background()

	t.Run("forward past expiry, reap, back", func(t *testing.T) {
		d := startFaultDaemon(t)
		l := d.acquireOnce(apitype.AcquireRequest{SessionID: "jumpy", TTLSeconds: 60})
		marker := "sidecar-fault-clock-" + strconv.Itoa(os.Getpid())
		if status, _, body := d.raw("POST", "/v1/leases/"+l.ID()+"/processes", l.Token(),
			jsonBody(apitype.StartRequest{ID: "bg", Argv: []string{"sh", "-c", "while :; do sleep 1; done", marker}}), nil); status != 201 {
			t.Fatalf("start: %d %s", status, body)
		}
		waitFor(t, "the marked process", 10*time.Second, func() bool { return len(markedProcs(marker)) > 0 })

		d.clock.Advance(61 * time.Second)
		if _, err := d.client.Renew(ctx, l.ID(), time.Minute); !errors.Is(err, client.ErrLeaseExpired) {
			t.Fatalf("renew after the jump past expiry: %v, want ErrLeaseExpired", err)
		}
		if _, err := l.Exec(ctx, sh("true")); err == nil {
			t.Fatal("an expired lease still runs commands")
		}
		// Back again before any reap: the lease's expiry is a point in time, so it is
		// active again; nothing was lost in between.
		d.clock.Advance(-61 * time.Second)
		if got := must(d.client.Get(ctx, l.ID()))(t); got.State != apitype.LeaseActive {
			t.Logf("after jumping back before a reap the lease is %s", got.State)
		}
		// Forward again, and reaped: everything of it goes, and no backward jump brings it back.
		d.clock.Advance(61 * time.Second)
		res := must(d.client.Cleanup(ctx))(t)
		if len(res.Leases) != 1 || res.Leases[0] != l.ID() {
			t.Fatalf("cleanup reaped %v", res.Leases)
		}
		waitFor(t, "the reaped lease's processes to die", 10*time.Second, func() bool { return len(markedProcs(marker)) == 0 })
		waitRetired(t, d.cfg.WorkRoot, l.ID())
		for _, cg := range daemontest.CgroupParents(d.cfg.CgroupParent) {
			if dirExists(filepath.Join(cg, l.ID())) {
				t.Fatalf("the reaped lease's cgroup remains: %s", cg)
			}
		}
		d.clock.Advance(-time.Hour)
		if _, err := d.client.Get(ctx, l.ID()); !errors.Is(err, client.ErrLeaseNotFound) {
			t.Fatalf("a reaped lease after the clock went back: %v", err)
		}
		if again := d.acquireOnce(apitype.AcquireRequest{SessionID: "jumpy"}); again.ID() == l.ID() {
			t.Fatal("the reaped lease came back")
		}
	})

	t.Run("renew at the edge", func(t *testing.T) {
		d := startFaultDaemon(t)
		l := d.acquireOnce(apitype.AcquireRequest{SessionID: "edge", TTLSeconds: 60})
		// 5 s before expiry: the real time between acquire and renew counts too, and a
		// loaded CI machine may take a while.
		d.clock.Advance(55 * time.Second)
		renewed, err := d.client.Renew(ctx, l.ID(), time.Minute)
		if err != nil {
			t.Fatalf("renew 5 s before expiry: %v", err)
		}
		if !renewed.ExpiresAt.After(l.Info().ExpiresAt.Add(50 * time.Second)) {
			t.Fatalf("renew moved expiry from %v to %v", l.Info().ExpiresAt, renewed.ExpiresAt)
		}
		// Just past the old expiry the lease is alive; just past the new one it is not.
		d.clock.Advance(time.Second)
		if _, err := d.client.Renew(ctx, l.ID(), time.Minute); err != nil {
			t.Fatalf("renew after the old expiry passed: %v", err)
		}
		d.clock.Advance(61 * time.Second)
		if _, err := d.client.Renew(ctx, l.ID(), time.Minute); !errors.Is(err, client.ErrLeaseExpired) {
			t.Fatalf("renew just past the new expiry: %v, want ErrLeaseExpired", err)
		}
	})

	t.Run("clock goes backwards", func(t *testing.T) {
		d := startFaultDaemon(t)
		l := d.acquireOnce(apitype.AcquireRequest{SessionID: "backwards", TTLSeconds: 60})
		d.clock.Advance(-2 * time.Hour)
		if got := must(l.Get(ctx))(t); got.State != apitype.LeaseActive {
			t.Fatalf("a backward jump expired a lease: %+v", got)
		}
		res := must(d.client.Cleanup(ctx))(t)
		if len(res.Leases) != 0 {
			t.Fatalf("a backward jump made cleanup reap %v", res.Leases)
		}
		// A renew under the jumped clock must hand out a token that works under it.
		renewed, err := d.client.Renew(ctx, l.ID(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.newClient(renewed.Token).OpenLease(l.ID(), renewed.Token).Get(ctx); err != nil {
			t.Errorf("BUG: the token a renew issued under the daemon's clock is refused (%v): "+
				"daemon.Start builds lease.Tokens without WithClock(cfg.Now), so tokens expire by the wall clock "+
				"(exp %v) while leases expire by Config.Now", err, renewed.ExpiresAt.Format(time.RFC3339))
		}
		// The lease's expiry follows the clock it was renewed under.
		d.clock.Advance(2*time.Hour + time.Second)
		if _, err := d.client.Renew(ctx, l.ID(), time.Minute); !errors.Is(err, client.ErrLeaseExpired) &&
			!strings.Contains(errString(err), "expired") {
			t.Fatalf("renew after the clock caught up past the renewed expiry: %v", err)
		}
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
