package client

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// A fleet is several sidecars behind one Client: SANDBOX_REMOTE_URL as a comma-separated
// list, or one name whose every address is a sidecar (Discovery "dns", a Kubernetes
// headless Service). There is no coordinator: each Client places new leases by the
// capacity the sidecars report, and a lease stays on its sidecar for its whole life (a
// lease is processes and files on one kernel; nothing migrates).
//
//   - A new lease: the session's existing lease is looked for first (on every sidecar,
//     GET /v1/leases?session_id=), so a session never gets a second sandbox elsewhere.
//     Else two candidates, the two sidecars ranking highest for the session id by
//     rendezvous hashing (so two processes placing one session at once pick the same
//     two), are asked for /v1/info and the one with more free room (the tighter of free
//     lease slots and memory headroom, as fractions) takes it: the power of two choices.
//     One that is draining, full or unreachable is skipped, and the next choice tried.
//   - Every later call of a Lease goes to its sidecar: the handle holds that sidecar's
//     client. A lease named by id alone (Get, Renew, Release, OpenLease in a worker that
//     got the id and token from the app) is found in this Client's map of the leases it
//     has seen, else by asking every sidecar for it once (GET /v1/leases/{id}).
//   - List and Cleanup cover every sidecar; a sidecar that does not answer is named in
//     the error, and the others' results are still returned.
type fleet struct {
	cfg       Config // the template of each member's Config
	dnsName   string // Discovery "dns": the name resolved, and every member's TLS ServerName
	dnsPort   string
	lookup    func(ctx context.Context, host string) ([]string, error)
	log       func(msg string, args ...any)
	probeTime time.Duration

	mu         sync.Mutex
	members    []*member
	resolvedAt time.Time
	leases     map[string]*member // lease id → its sidecar, as seen by this Client
	next       int                // round robin of calls that need no particular sidecar
}

type member struct {
	url       string
	c         *Client
	downUntil time.Time // guarded by fleet.mu: skipped for new leases until then
}

const (
	// fleetResolveEvery: how stale the addresses of a DNS fleet may get before the name
	// is resolved again (pods come and go).
	fleetResolveEvery = 30 * time.Second
	// fleetDownFor: a sidecar that failed to answer is left out of placement this long.
	fleetDownFor = 5 * time.Second
	// fleetProbeTimeout bounds each capacity, session and lease look-up on one sidecar.
	fleetProbeTimeout = 10 * time.Second
	// fleetLeaseMap bounds the lease map; past it the map starts over (a miss costs one
	// look-up on every sidecar, never a wrong answer).
	fleetLeaseMap = 100_000
)

// isFleet says whether cfg names several sidecars.
func isFleet(cfg Config) bool {
	return strings.Contains(cfg.URL, ",") || cfg.Discovery == DiscoveryDNS
}

func newFleet(cfg Config) (*Client, error) {
	f := &fleet{cfg: cfg, lookup: cfg.LookupHost, leases: map[string]*member{}, probeTime: fleetProbeTimeout}
	c := &Client{fleet: f, token: cfg.Token, log: cfg.Logger}
	if c.log == nil {
		c.log = discardLogger()
	}
	f.log = c.log.Warn
	if f.lookup == nil {
		f.lookup = net.DefaultResolver.LookupHost
	}
	if cfg.Discovery == DiscoveryDNS {
		if strings.Contains(cfg.URL, ",") {
			return nil, errors.New("client: DNS discovery takes one URL, not a list")
		}
		u, err := parseBase(cfg.URL)
		if err != nil {
			return nil, err
		}
		f.dnsName, f.dnsPort = u.Hostname(), u.Port()
		if f.dnsPort == "" {
			f.dnsPort = "443"
		}
		if net.ParseIP(f.dnsName) != nil {
			return nil, fmt.Errorf("client: DNS discovery needs a name, not the address %s", f.dnsName)
		}
		return c, nil // resolved at first use: a name briefly unknown must not fail start-up
	}
	for _, raw := range strings.Split(cfg.URL, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		if err := f.add(raw, ""); err != nil {
			return nil, err
		}
	}
	if len(f.members) == 0 {
		return nil, errors.New("client: the URL list names no sidecar")
	}
	return c, nil
}

// add builds a member for one URL (serverName: the TLS name when it is not the URL's host).
func (f *fleet) add(raw, serverName string) error {
	mc := f.cfg
	mc.URL, mc.Discovery, mc.serverName = raw, "", serverName
	c, err := New(mc)
	if err != nil {
		return fmt.Errorf("%w (in the list: %s)", err, raw)
	}
	u := c.base.String()
	for _, m := range f.members {
		if m.url == u {
			return fmt.Errorf("client: %s is in the list twice", raw)
		}
	}
	f.members = append(f.members, &member{url: u, c: c})
	return nil
}

// current is the member list, DNS resolved again when stale. A failed resolution keeps
// the previous addresses.
func (f *fleet) current(ctx context.Context) ([]*member, error) {
	f.mu.Lock()
	if f.dnsName == "" || time.Since(f.resolvedAt) < fleetResolveEvery && len(f.members) > 0 {
		defer f.mu.Unlock()
		return slices.Clone(f.members), nil
	}
	f.mu.Unlock()
	// Resolved without the lock: a slow resolver must not hold up calls on known leases.
	rctx, cancel := context.WithTimeout(ctx, f.probeTime)
	addrs, err := f.lookup(rctx, f.dnsName)
	cancel()
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil || len(addrs) == 0 {
		if len(f.members) > 0 {
			f.log("fleet: resolving failed; keeping the previous sidecars", "name", f.dnsName, "err", err)
			return slices.Clone(f.members), nil
		}
		return nil, fmt.Errorf("client: resolve %s: %w (no sidecar known)", f.dnsName, errOr(err, errors.New("no address")))
	}
	old := f.members
	f.members = nil
	slices.Sort(addrs)
	for _, a := range slices.Compact(addrs) {
		u := "https://" + net.JoinHostPort(a, f.dnsPort)
		if i := slices.IndexFunc(old, func(m *member) bool { return m.url == u }); i >= 0 {
			f.members = append(f.members, old[i]) // keep its connections and down mark
			continue
		}
		if err := f.add(u, f.dnsName); err != nil {
			return nil, err
		}
	}
	f.resolvedAt = time.Now()
	return slices.Clone(f.members), nil
}

func errOr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

func (f *fleet) up(m *member) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().After(m.downUntil)
}

// failed notes a call to m that got no answer: m is left out of placement for a while.
// An error reply (draining, full) is an answer and leaves it in.
func (f *fleet) failed(m *member, err error) {
	var ae *APIError
	if errors.As(err, &ae) || errors.Is(err, context.Canceled) {
		return
	}
	f.mu.Lock()
	m.downUntil = time.Now().Add(fleetDownFor)
	f.mu.Unlock()
	f.log("fleet: sidecar did not answer; skipped for new leases for a while", "sidecar", m.url, "err", err)
}

func (f *fleet) remember(id string, m *member) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.leases) >= fleetLeaseMap {
		clear(f.leases)
	}
	f.leases[id] = m
}

func (f *fleet) forget(id string) {
	f.mu.Lock()
	delete(f.leases, id)
	f.mu.Unlock()
}

// skippable: the sidecar cannot take this new lease, another may.
func skippable(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	switch ae.Code {
	case apitype.CodeDraining, apitype.CodeLeaseLimit, apitype.CodeUnavailable, apitype.CodeQuotaExceeded, apitype.CodeInternal:
		return true
	}
	return false
}

func (f *fleet) acquire(ctx context.Context, req apitype.AcquireRequest) (*Lease, error) {
	members, err := f.current(ctx)
	if err != nil {
		return nil, err
	}
	var errs []error
	tried := map[*member]bool{}
	take := func(m *member) (*Lease, bool, error) {
		tried[m] = true
		l, err := m.c.Acquire(ctx, req)
		if err == nil {
			f.remember(l.ID(), m)
			return l, true, nil
		}
		f.failed(m, err)
		if !skippable(err) {
			return nil, true, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", m.url, err))
		return nil, false, nil
	}
	// The session's lease where it lives: a draining sidecar still returns it.
	if m := f.findSession(ctx, members, req.SessionID); m != nil {
		if l, done, err := take(m); done {
			return l, err
		}
	}
	for {
		m := f.choose(ctx, members, req.SessionID, tried, &errs)
		if m == nil {
			break
		}
		if l, done, err := take(m); done {
			return l, err
		}
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("client: no sidecar can take a new lease: %w", ErrUnavailable)
	}
	return nil, fmt.Errorf("client: no sidecar took the lease: %w", errors.Join(errs...))
}

// findSession is the member holding an active lease of session, if one answers so.
func (f *fleet) findSession(ctx context.Context, members []*member, session string) *member {
	type hit struct {
		m  *member
		id string
	}
	hits := parallel(members, func(m *member) (hit, bool) {
		if !f.up(m) {
			return hit{}, false
		}
		pctx, cancel := context.WithTimeout(ctx, f.probeTime)
		defer cancel()
		var list apitype.LeaseList
		err := m.c.doJSON(pctx, request{method: http.MethodGet, path: apitype.RouteLeases, query: url.Values{"session_id": {session}}, idempotent: true}, &list)
		if err != nil {
			f.failed(m, err)
			return hit{}, false
		}
		for _, l := range list.Leases { // a daemon before the filter lists them all
			if l.SessionID == session && l.State == apitype.LeaseActive {
				return hit{m, l.ID}, true
			}
		}
		return hit{}, false
	})
	if len(hits) == 0 {
		return nil
	}
	return hits[0].m
}

// choose picks, among the members not tried yet and not down, the two ranking highest
// for session and returns the one with more room; a candidate that is draining, full or
// silent is marked tried (its reason in errs) and the choice made again.
func (f *fleet) choose(ctx context.Context, members []*member, session string, tried map[*member]bool, errs *[]error) *member {
	for {
		var cands []*member
		for _, m := range members {
			if !tried[m] && f.up(m) {
				cands = append(cands, m)
			}
		}
		if len(cands) == 0 {
			return nil
		}
		slices.SortFunc(cands, func(a, b *member) int { return cmpUint(rank(session, b.url), rank(session, a.url)) })
		cands = cands[:min(2, len(cands))]
		type scored struct {
			m     *member
			score float64
		}
		var best *scored
		for _, s := range parallel(cands, func(m *member) (scored, bool) {
			pctx, cancel := context.WithTimeout(ctx, f.probeTime)
			defer cancel()
			info, err := m.c.Info(pctx)
			switch {
			case err != nil:
				f.failed(m, err)
			case info.Draining:
				err = ErrDraining
			case info.Capacity.FreeLeases <= 0 && info.Limits.MaxLeases > 0:
				err = ErrLeaseLimit
			default:
				return scored{m, Room(info.Capacity, info.Limits.MaxLeases)}, true
			}
			f.mu.Lock()
			tried[m] = true
			*errs = append(*errs, fmt.Errorf("%s: %w", m.url, err))
			f.mu.Unlock()
			return scored{}, false
		}) {
			if best == nil || s.score > best.score || s.score == best.score && rank(session, s.m.url) > rank(session, best.m.url) {
				best = &s
			}
		}
		if best != nil {
			return best.m
		}
	}
}

// Room is the free fraction of a sidecar, the tighter of its lease slots and its memory
// headroom: 1 empty, 0 full. A sidecar that reports no memory figure is weighed by slots.
func Room(c apitype.Capacity, maxLeases int) float64 {
	r := 1.0
	if maxLeases > 0 {
		r = float64(c.FreeLeases) / float64(maxLeases)
	}
	if c.MemoryBytes > 0 {
		r = min(r, float64(c.MemoryHeadroomBytes)/float64(c.MemoryBytes))
	}
	return r
}

// rank is the rendezvous hash of a session on a sidecar.
func rank(session, member string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(session))
	h.Write([]byte{0})
	h.Write([]byte(member))
	return h.Sum64()
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// parallel runs fn on every member at once and returns the results it kept, in member
// order.
func parallel[T any](members []*member, fn func(*member) (T, bool)) []T {
	res := make([]T, len(members))
	ok := make([]bool, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Go(func() { res[i], ok[i] = fn(m) })
	}
	wg.Wait()
	var out []T
	for i := range res {
		if ok[i] {
			out = append(out, res[i])
		}
	}
	return out
}

// locate is the member holding lease id, asked with token ("" the shared one): the map,
// else every member at once. ErrLeaseNotFound when none has it.
func (f *fleet) locate(ctx context.Context, id, token string) (*member, error) {
	f.mu.Lock()
	m := f.leases[id]
	f.mu.Unlock()
	if m != nil {
		return m, nil
	}
	members, err := f.current(ctx)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var errs []error
	hits := parallel(members, func(m *member) (*member, bool) {
		pctx, cancel := context.WithTimeout(ctx, f.probeTime)
		defer cancel()
		var l apitype.Lease
		err := m.c.doJSON(pctx, request{method: http.MethodGet, path: leasePath(id), token: token, idempotent: true}, &l)
		if err == nil {
			return m, true
		}
		if !errors.Is(err, ErrLeaseNotFound) && !errors.Is(err, ErrUnauthorized) {
			mu.Lock()
			errs = append(errs, fmt.Errorf("%s: %w", m.url, err))
			mu.Unlock()
		}
		return nil, false
	})
	if len(hits) > 0 {
		f.remember(id, hits[0])
		return hits[0], nil
	}
	if len(errs) > 0 { // it may live on one that did not answer
		return nil, fmt.Errorf("client: lease %s not found on the sidecars that answered: %w", id, errors.Join(errs...))
	}
	return nil, fmt.Errorf("client: lease %s is on no sidecar: %w", id, ErrLeaseNotFound)
}

// openLease binds a worker's handle to the lease's sidecar, looked up once. When the
// look-up fails, the handle is bound to the first sidecar and its calls fail there with
// the daemon's own error (lease_not_found).
func (f *fleet) openLease(id, token string) *Lease {
	ctx, cancel := context.WithTimeout(context.Background(), f.probeTime)
	defer cancel()
	m, err := f.locate(ctx, id, token)
	if err != nil {
		f.log("fleet: open lease: not found on any sidecar", "lease", id, "err", err)
		members, _ := f.current(ctx)
		if len(members) == 0 {
			return &Lease{c: &Client{fleet: f, token: token, log: discardLogger()}, id: id, byToken: true, info: apitype.Lease{ID: id, Token: token}}
		}
		m = members[0]
	}
	return m.c.OpenLease(id, token)
}

// each runs fn on every member at once; the errors name their sidecar.
func (f *fleet) each(ctx context.Context, fn func(m *member) error) error {
	members, err := f.current(ctx)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	var errs []error
	parallel(members, func(m *member) (struct{}, bool) {
		if err := fn(m); err != nil {
			mu.Lock()
			errs = append(errs, fmt.Errorf("%s: %w", m.url, err))
			mu.Unlock()
		}
		return struct{}{}, true
	})
	return errors.Join(errs...)
}

func (f *fleet) list(ctx context.Context) ([]apitype.Lease, error) {
	var mu sync.Mutex
	var all []apitype.Lease
	err := f.each(ctx, func(m *member) error {
		leases, err := m.c.List(ctx)
		mu.Lock()
		defer mu.Unlock()
		for _, l := range leases {
			all = append(all, l)
			f.remember(l.ID, m)
		}
		return err
	})
	slices.SortFunc(all, func(a, b apitype.Lease) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return all, err
}

func (f *fleet) cleanup(ctx context.Context) (apitype.CleanupResult, error) {
	var mu sync.Mutex
	var all apitype.CleanupResult
	err := f.each(ctx, func(m *member) error {
		res, err := m.c.Cleanup(ctx)
		mu.Lock()
		defer mu.Unlock()
		all.Leases = append(all.Leases, res.Leases...)
		all.Cgroups = append(all.Cgroups, res.Cgroups...)
		all.Workdirs = append(all.Workdirs, res.Workdirs...)
		all.Processes = append(all.Processes, res.Processes...)
		return err
	})
	return all, err
}

// any runs fn on one member that answers, round robin, the next on no answer.
func (f *fleet) any(ctx context.Context, fn func(m *member) error) error {
	members, err := f.current(ctx)
	if err != nil {
		return err
	}
	f.mu.Lock()
	start := f.next
	f.next++
	f.mu.Unlock()
	var errs []error
	for i := range members {
		m := members[(start+i)%len(members)]
		if !f.up(m) && i < len(members)-1 {
			continue
		}
		err := fn(m)
		var ae *APIError
		if err == nil || errors.As(err, &ae) {
			return err
		}
		f.failed(m, err)
		errs = append(errs, fmt.Errorf("%s: %w", m.url, err))
	}
	return errors.Join(errs...)
}

func (f *fleet) closeIdle() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.members {
		m.c.CloseIdleConnections()
	}
}
