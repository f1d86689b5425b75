package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Lease is a handle on one lease. One from Acquire renews itself in the background until
// Release; one from OpenLease works with the lease token it was given, never renews, and
// takes the fresh token the daemon hands it after the owner renewed the lease.
type Lease struct {
	c  *Client
	id string
	// byToken: lease routes authenticate with the lease token (info.Token) rather than
	// the client's shared token.
	byToken bool

	mu      sync.Mutex
	info    apitype.Lease
	err     error // last renewal failure; nil after a success
	stop    context.CancelFunc
	stopped chan struct{} // closed when the renewer has returned; nil without one
}

// Acquire asks for the lease of req.SessionID (the same active lease comes back for the
// same session, so it is retried safely) and renews it at about a third of its TTL until
// Release (or StopRenewing) is called. ctx bounds the acquire call only: renewal belongs
// to the handle, so a request-scoped context ending does not stop it. Renewal failures
// are retried with backoff and reported by Err; an expired or vanished lease stops the
// renewal for good.
func (c *Client) Acquire(ctx context.Context, req apitype.AcquireRequest) (*Lease, error) {
	if c.fleet != nil {
		return c.fleet.acquire(ctx, req)
	}
	info, err := c.acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	l := &Lease{c: c, id: info.ID, info: info, stopped: make(chan struct{})}
	ttl := time.Duration(req.TTLSeconds) * time.Second
	if ttl <= 0 {
		ttl = info.ExpiresAt.Sub(info.CreatedAt)
	}
	// Without ctx's cancellation, with its values (loggers, trace ids).
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.stop = cancel
	go func() {
		defer close(l.stopped)
		l.renewLoop(rctx, ttl, time.Duration(req.TTLSeconds)*time.Second)
	}()
	return l, nil
}

// OpenLease is a handle on an existing lease, authenticated by its lease token (the
// worker's case). It does not renew; call Client.Renew through a shared-token client, or
// ask the owner to. When the owner renews the lease past the token's expiry, the daemon's
// next reply to this handle carries a fresh token, which the handle keeps (Token); a
// worker idle for longer than its token's remaining life calls RefreshToken first.
//
// On a fleet, the lease's sidecar is looked up first (this Client's map of the leases it
// has seen, else one GET on every sidecar, bounded by 10 s).
func (c *Client) OpenLease(id, token string) *Lease {
	if c.fleet != nil {
		return c.fleet.openLease(id, token)
	}
	return &Lease{c: c, id: id, byToken: true, info: apitype.Lease{ID: id, Token: token}}
}

// ID is the lease id.
func (l *Lease) ID() string { return l.id }

// Token is the newest lease token known to this handle.
func (l *Lease) Token() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.info.Token
}

// cred is the credential for this lease's routes; empty means the client's own.
func (l *Lease) cred() string {
	if !l.byToken {
		return ""
	}
	return l.Token()
}

// Info is the lease as last returned by acquire or renew. After the acquire that created
// the lease it has no Usage (nothing has run yet): Get reads the live figures.
func (l *Lease) Info() apitype.Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.info
}

// Err is the last background renewal error, nil while renewals succeed.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// RefreshToken asks the daemon for the lease's state with this handle's credential; a
// lease token that the lease has outlived comes back replaced by a fresh one. It does
// not extend the lease.
func (l *Lease) RefreshToken(ctx context.Context) error {
	_, err := l.Get(ctx)
	return err
}

// tokenRefreshed keeps a fresh token the daemon sent in X-Lease-Token.
func (l *Lease) tokenRefreshed(tok string) {
	if tok == "" || !l.byToken {
		return
	}
	l.mu.Lock()
	l.info.Token = tok
	l.mu.Unlock()
}

// Release stops the renewal and releases the lease on the daemon.
func (l *Lease) Release(ctx context.Context) error {
	l.StopRenewing()
	return l.c.release(ctx, l.id, l)
}

// StopRenewing ends the background renewal without releasing the lease (a handle
// handed over to someone else, or a program exiting while the lease should live on
// until its TTL). It returns once the renewer has stopped.
func (l *Lease) StopRenewing() {
	if l.stop == nil {
		return
	}
	l.stop()
	<-l.stopped
}

// Minimum pause between renewals, so a tiny TTL cannot turn into a busy loop.
const minRenewInterval = 50 * time.Millisecond

// renewLoop renews at a third of ttl; a failure is retried with backoff (never past the
// next regular renewal) until the lease is known gone.
func (l *Lease) renewLoop(ctx context.Context, ttl, reqTTL time.Duration) {
	every := max(ttl/3, minRenewInterval)
	t := time.NewTimer(every)
	defer t.Stop()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		info, err := l.c.renew(ctx, l.id, l, reqTTL)
		if ctx.Err() != nil {
			return
		}
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		if err == nil {
			l.update(info)
		}
		if err == nil {
			failures = 0
			t.Reset(every)
			continue
		}
		if IsLeaseGone(err) || errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrForbidden) {
			l.c.log.Warn("lease renewal stopped", "lease", l.id, "err", err)
			return
		}
		failures++
		l.c.log.Warn("lease renewal failed; retrying", "lease", l.id, "err", err, "failures", failures)
		t.Reset(min(l.c.retry.delay(failures), every))
	}
}

// update keeps the newest lease state; a reply without a token keeps the old token.
func (l *Lease) update(info apitype.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if info.Token == "" {
		info.Token = l.info.Token
	}
	l.info = info
}
