package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Info reports the daemon's version, capabilities and limits.
//
// On a fleet, it is the info of one sidecar that answers.
func (c *Client) Info(ctx context.Context) (apitype.Info, error) {
	var info apitype.Info
	if c.fleet != nil {
		err := c.fleet.any(ctx, func(m *member) (err error) { info, err = m.c.Info(ctx); return err })
		return info, err
	}
	err := c.doJSON(ctx, request{method: http.MethodGet, path: apitype.RouteInfo, idempotent: true}, &info)
	return info, err
}

// List returns every lease the daemon holds (shared token only). On a fleet, the leases
// of every sidecar; when some do not answer, the others' leases come with an error
// naming those.
func (c *Client) List(ctx context.Context) ([]apitype.Lease, error) {
	if c.fleet != nil {
		return c.fleet.list(ctx)
	}
	var list apitype.LeaseList
	err := c.doJSON(ctx, request{method: http.MethodGet, path: apitype.RouteLeases, idempotent: true}, &list)
	return list.Leases, err
}

// Get returns one lease.
func (c *Client) Get(ctx context.Context, id string) (apitype.Lease, error) {
	if c.fleet != nil {
		m, err := c.fleet.locate(ctx, id, "")
		if err != nil {
			return apitype.Lease{}, err
		}
		return m.c.Get(ctx, id)
	}
	return c.getLease(ctx, id, nil)
}

// UsageHistory returns the lease's usage over the last hour: the daemon's samples, oldest
// first, one every apitype.UsageSampleInterval.
func (c *Client) UsageHistory(ctx context.Context, id string) (apitype.UsageHistory, error) {
	if c.fleet != nil {
		m, err := c.fleet.locate(ctx, id, "")
		if err != nil {
			return apitype.UsageHistory{}, err
		}
		return m.c.UsageHistory(ctx, id)
	}
	return c.usageHistory(ctx, id, nil)
}

func (c *Client) usageHistory(ctx context.Context, id string, h *Lease) (apitype.UsageHistory, error) {
	var out apitype.UsageHistory
	err := c.doJSON(ctx, request{method: http.MethodGet, path: leasePath(id) + "/usage", lease: h, idempotent: true}, &out)
	return out, err
}

// getLease, renew and release act with h's credential, or the client's when h is nil.
func (c *Client) getLease(ctx context.Context, id string, h *Lease) (apitype.Lease, error) {
	var l apitype.Lease
	err := c.doJSON(ctx, request{method: http.MethodGet, path: leasePath(id), lease: h, idempotent: true}, &l)
	return l, err
}

// acquire is POST /v1/leases. It is idempotent by session id, so it is retried.
func (c *Client) acquire(ctx context.Context, req apitype.AcquireRequest) (apitype.Lease, error) {
	var l apitype.Lease
	err := c.doJSON(ctx, request{method: http.MethodPost, path: apitype.RouteLeases, json: req, idempotent: true}, &l)
	return l, err
}

// Renew extends a lease by ttl (zero: the daemon's default) and returns it with a fresh
// token. An expired lease cannot be renewed: ErrLeaseExpired.
func (c *Client) Renew(ctx context.Context, id string, ttl time.Duration) (apitype.Lease, error) {
	if c.fleet != nil {
		m, err := c.fleet.locate(ctx, id, "")
		if err != nil {
			return apitype.Lease{}, err
		}
		return m.c.Renew(ctx, id, ttl)
	}
	return c.renew(ctx, id, nil, ttl)
}

func (c *Client) renew(ctx context.Context, id string, h *Lease, ttl time.Duration) (apitype.Lease, error) {
	var l apitype.Lease
	body := apitype.RenewRequest{TTLSeconds: int64((ttl + time.Second - 1) / time.Second)}
	err := c.doJSON(ctx, request{method: http.MethodPost, path: leasePath(id, "renew"), json: body, lease: h, idempotent: true}, &l)
	return l, err
}

// Release kills every process of the lease and removes its workdir. An unknown or
// already released lease is ErrLeaseNotFound.
func (c *Client) Release(ctx context.Context, id string) error {
	if c.fleet != nil {
		m, err := c.fleet.locate(ctx, id, "")
		if err != nil {
			return err
		}
		c.fleet.forget(id)
		return m.c.Release(ctx, id)
	}
	return c.release(ctx, id, nil)
}

func (c *Client) release(ctx context.Context, id string, h *Lease) error {
	return c.doJSON(ctx, request{method: http.MethodDelete, path: leasePath(id), lease: h, idempotent: true}, nil)
}

// Cleanup reaps expired leases and orphans and says what it reaped (shared token only).
// Reaping twice reaps nothing more, so it is retried like an idempotent call.
//
// On a fleet, every sidecar reaps; the results are merged.
func (c *Client) Cleanup(ctx context.Context) (apitype.CleanupResult, error) {
	if c.fleet != nil {
		return c.fleet.cleanup(ctx)
	}
	var res apitype.CleanupResult
	err := c.doJSON(ctx, request{method: http.MethodPost, path: apitype.RouteCleanup, idempotent: true}, &res)
	return res, err
}

// Drain tells the daemon to refuse new leases while its leases run to their end (true),
// or to take new leases again (false); shared token only. The reply says how many leases
// are still active. Setting the same state twice changes nothing, so it is retried.
//
// A drain names one sidecar: on a fleet it is refused without a request.
func (c *Client) Drain(ctx context.Context, on bool) (apitype.DrainStatus, error) {
	if c.fleet != nil {
		return apitype.DrainStatus{}, fmt.Errorf("%w: a drain names one sidecar; give its URL alone", ErrInvalidRequest)
	}
	var st apitype.DrainStatus
	method := http.MethodPost
	if !on {
		method = http.MethodDelete
	}
	err := c.doJSON(ctx, request{method: method, path: apitype.RouteDrain, idempotent: true}, &st)
	return st, err
}

// RunScript runs a QuickJS transform. A syntax error or exception is an *APIError
// matching ErrScript, with Line and Column. Scripts touch no state, so it is retried.
func (c *Client) RunScript(ctx context.Context, req apitype.ScriptRequest) (apitype.ScriptResult, error) {
	var res apitype.ScriptResult
	if c.fleet != nil { // any sidecar: scripts touch no lease
		err := c.fleet.any(ctx, func(m *member) (err error) { res, err = m.c.RunScript(ctx, req); return err })
		return res, err
	}
	err := c.doJSON(ctx, request{method: http.MethodPost, path: apitype.RouteScriptsRun, json: req, idempotent: true}, &res)
	return res, err
}

// escapeID is the escaped form of an id inside a route.
func escapeID(id string) string { return url.PathEscape(id) }
