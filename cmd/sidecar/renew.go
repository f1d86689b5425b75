package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func init() {
	register("renew", command{summary: "extend a lease (--ttl: to that long from now; default: the daemon's TTL)",
		usage: `usage: sidecar renew [--ttl 1h] [-o text|json] LEASE

Extends LEASE to expire TTL from now (default: the daemon's SIDECAR_LEASE_TTL, at most
SIDECAR_LEASE_MAX_TTL). An expired lease cannot be renewed. sidecar shell and exec -it
renew their lease by themselves while they run.`, run: runRenew})
}

func runRenew(ctx context.Context, args []string) error {
	fs := newFlagSet("renew")
	ttl := fs.Duration("ttl", 0, "the lease's new time to live, from now (0: the daemon's default)")
	output := outputFlag(fs, "text", "json")
	pos, err := operands(fs, args, 1, commands["renew"].usage)
	if err != nil {
		return err
	}
	if *ttl < 0 || *ttl%time.Second != 0 {
		return usagef("--ttl %v: want a positive whole number of seconds", *ttl)
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	info, err := c.Renew(ctx, pos[0], *ttl)
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, info)
	}
	fmt.Printf("%s expires %s (%s)\n", info.ID, info.ExpiresAt.Local().Format(time.RFC3339), expiresIn(info.ExpiresAt, time.Now()))
	return nil
}

// minKeepEvery bounds how often a keeper renews, whatever the lease's TTL.
const minKeepEvery = time.Second

// leaseKeeper renews a lease while a person is attached to it (shell, exec -it): every
// third of the time the lease had left when they attached, by that much again. It
// remembers the last expiry it knew, to tell an expired lease from a released one once
// the daemon has forgotten it.
type leaseKeeper struct {
	l    *client.Lease
	stop context.CancelFunc
	done chan struct{}

	mu      sync.Mutex
	expires time.Time
}

// keepLease starts renewing l; a lease that cannot be read is not renewed (the command
// itself will report why).
func keepLease(ctx context.Context, l *client.Lease) *leaseKeeper {
	k := &leaseKeeper{l: l, done: make(chan struct{})}
	info, err := l.Get(ctx)
	if err != nil || info.State != apitype.LeaseActive {
		close(k.done)
		k.stop = func() {}
		return k
	}
	k.expires = info.ExpiresAt
	ttl := time.Until(info.ExpiresAt).Round(time.Second)
	if ttl < 2*time.Second {
		ttl = 2 * time.Second
	}
	every := max(ttl/3, minKeepEvery)
	rctx, cancel := context.WithCancel(ctx)
	k.stop = cancel
	go func() {
		defer close(k.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
			}
			info, err := l.Renew(rctx, ttl)
			switch {
			case err == nil:
				k.mu.Lock()
				k.expires = info.ExpiresAt
				k.mu.Unlock()
			case client.IsLeaseGone(err):
				return // ended: the command's end says why
			}
		}
	}()
	return k
}

// Stop ends the renewal.
func (k *leaseKeeper) Stop() {
	k.stop()
	<-k.done
}

// ended says why the lease is no longer usable ("" while it is active).
func (k *leaseKeeper) ended(ctx context.Context) string {
	info, err := k.l.Get(ctx)
	k.mu.Lock()
	expires := k.expires
	k.mu.Unlock()
	switch {
	case err == nil && info.State == apitype.LeaseActive:
		return ""
	case err == nil:
		return fmt.Sprintf("lease %s expired at %s", k.l.ID(), info.ExpiresAt.Local().Format(time.TimeOnly))
	case errors.Is(err, client.ErrLeaseExpired):
		return fmt.Sprintf("lease %s expired", k.l.ID())
	case client.IsNotFound(err) && !expires.IsZero() && !time.Now().Before(expires):
		return fmt.Sprintf("lease %s expired at %s", k.l.ID(), expires.Local().Format(time.TimeOnly))
	case client.IsNotFound(err):
		return fmt.Sprintf("lease %s was released", k.l.ID())
	}
	return "" // the daemon cannot say: nothing to add
}
