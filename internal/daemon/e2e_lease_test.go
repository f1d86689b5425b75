package daemon_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/lease"
)

func TestLeaseLifecycle(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()

	l := d.acquire("session-a")
	if l.ID() == "" || l.Token() == "" {
		t.Fatalf("acquire returned id %q token set %v", l.ID(), l.Token() != "")
	}
	info := l.Info()
	if info.State != apitype.LeaseActive || info.SessionID != "session-a" {
		t.Fatalf("lease %+v", info)
	}

	// The same session gets the same lease back, with a fresh token.
	status, _, body := d.raw("POST", "/v1/leases", testToken, jsonBody(apitype.AcquireRequest{SessionID: "session-a"}), nil)
	if status != http.StatusOK || !strings.Contains(string(body), l.ID()) {
		t.Fatalf("re-acquire: %d %s", status, body)
	}

	before := must(d.client.Get(ctx, l.ID()))(t)
	d.clock.Advance(10 * time.Second)
	renewed := must(d.client.Renew(ctx, l.ID(), 30*time.Minute))(t)
	if !renewed.ExpiresAt.After(before.ExpiresAt) || renewed.Token == "" {
		t.Fatalf("renew: expires %v (was %v), token set %v", renewed.ExpiresAt, before.ExpiresAt, renewed.Token != "")
	}

	list := must(d.client.List(ctx))(t)
	if len(list) != 1 || list[0].ID != l.ID() || list[0].Usage == nil {
		t.Fatalf("list: %+v", list)
	}
	// The usage history, with the lease's own token and with the shared one (the
	// sampler's first pass may or may not have seen the lease yet).
	for _, get := range []func(context.Context) (apitype.UsageHistory, error){
		l.UsageHistory,
		func(ctx context.Context) (apitype.UsageHistory, error) { return d.client.UsageHistory(ctx, l.ID()) },
	} {
		if h := must(get(ctx))(t); h.IntervalSeconds != 10 || h.Samples == nil {
			t.Fatalf("usage history of a new lease: %+v", h)
		}
	}

	if err := d.client.Release(ctx, l.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.Get(ctx, l.ID()); !errors.Is(err, client.ErrLeaseNotFound) {
		t.Fatalf("get after release: %v, want ErrLeaseNotFound", err)
	}
	if err := d.client.Release(ctx, l.ID()); !errors.Is(err, client.ErrLeaseNotFound) {
		t.Fatalf("second release: %v, want ErrLeaseNotFound", err)
	}
}

func TestLeaseExpiryWithInjectedClock(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	l := d.acquireOnce(apitype.AcquireRequest{SessionID: "expiring", TTLSeconds: 60})
	d.clock.Advance(61 * time.Second)

	if _, err := d.client.Renew(ctx, l.ID(), time.Minute); !errors.Is(err, client.ErrLeaseExpired) {
		t.Fatalf("renew of an expired lease: %v, want ErrLeaseExpired", err)
	}
	// Its token died with it.
	lc := d.newClient(l.Token())
	if _, err := lc.Get(ctx, l.ID()); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("expired lease's token: %v, want ErrUnauthorized", err)
	}
	res := must(d.client.Cleanup(ctx))(t)
	if len(res.Leases) != 1 || res.Leases[0] != l.ID() {
		t.Fatalf("cleanup reaped %+v, want [%s]", res.Leases, l.ID())
	}
	if _, err := d.client.Get(ctx, l.ID()); !errors.Is(err, client.ErrLeaseNotFound) {
		t.Fatalf("get after reap: %v", err)
	}
	// The session can start over.
	l2 := d.acquire("expiring")
	if l2.ID() == l.ID() {
		t.Fatal("a reaped lease came back")
	}
}

func TestLeaseSurvivesRestart(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	l := d.acquireOnce(apitype.AcquireRequest{SessionID: "durable"})
	token := l.Token()

	d.restart()
	got := must(d.newClient(token).OpenLease(l.ID(), token).Get(ctx))(t)
	if got.ID != l.ID() || got.State != apitype.LeaseActive {
		t.Fatalf("after restart: %+v", got)
	}
	// Idempotent acquire still finds it.
	again := d.acquireOnce(apitype.AcquireRequest{SessionID: "durable"})
	if again.ID() != l.ID() {
		t.Fatalf("re-acquire after restart gave %s, want %s", again.ID(), l.ID())
	}
}

func TestTokenRotation(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	l := d.acquireOnce(apitype.AcquireRequest{SessionID: "rotating"})
	oldLeaseToken := l.Token()
	const newToken = "rotated-shared-token-abcdefghijklmnopqrstuvwxyz012"

	// Step 1: the daemon accepts both.
	d.restart(func(c *daemon.Config) { c.PreviousToken, c.SharedToken = c.SharedToken, newToken })
	for name, tok := range map[string]string{"old shared": testToken, "new shared": newToken} {
		if _, err := d.newClient(tok).List(ctx); err != nil {
			t.Fatalf("%s token during rotation: %v", name, err)
		}
	}
	if _, err := d.newClient(oldLeaseToken).OpenLease(l.ID(), oldLeaseToken).Get(ctx); err != nil {
		t.Fatalf("lease token issued under the old secret, during rotation: %v", err)
	}
	// Step 3: the old one is removed; so are lease tokens derived from it.
	d.restart(func(c *daemon.Config) { c.PreviousToken = "" })
	if _, err := d.newClient(testToken).List(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("old shared token after rotation: %v, want ErrUnauthorized", err)
	}
	if _, err := d.newClient(oldLeaseToken).OpenLease(l.ID(), oldLeaseToken).Get(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("old lease token after rotation: %v, want ErrUnauthorized", err)
	}
	fresh := must(d.newClient(newToken).Renew(ctx, l.ID(), time.Minute))(t)
	if _, err := d.newClient(fresh.Token).OpenLease(l.ID(), fresh.Token).Get(ctx); err != nil {
		t.Fatalf("new lease token: %v", err)
	}
}

func TestAuthRefusals(t *testing.T) {
	d := startDaemon(t)
	a := d.acquire("auth-a")
	b := d.acquire("auth-b")

	tamper := func(tok string) string {
		parts := strings.Split(tok, ".")
		sig := []byte(parts[2])
		sig[3] ^= 1
		return parts[0] + "." + parts[1] + "." + string(sig)
	}
	algNone := func(tok string) string {
		parts := strings.Split(tok, ".")
		hdr := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
		return hdr + "." + parts[1] + "."
	}
	cases := []struct {
		name, method, path, token string
		status                    int
		code                      string
	}{
		{"missing", "GET", "/v1/leases", "", 401, apitype.CodeUnauthorized},
		{"wrong", "GET", "/v1/leases", strings.Repeat("x", 40), 401, apitype.CodeUnauthorized},
		{"short", "GET", "/v1/leases", "short", 401, apitype.CodeUnauthorized},
		{"query string", "GET", "/v1/leases?access_token=" + testToken, "", 401, apitype.CodeUnauthorized},
		{"query string with header", "GET", "/v1/leases?token=" + testToken, testToken, 401, apitype.CodeUnauthorized},
		{"lease token on another lease", "GET", "/v1/leases/" + b.ID(), a.Token(), 403, apitype.CodeForbidden},
		{"lease token on a shared route", "GET", "/v1/leases", a.Token(), 403, apitype.CodeForbidden},
		{"lease token acquiring", "POST", "/v1/leases", a.Token(), 403, apitype.CodeForbidden},
		{"tampered JWT", "GET", "/v1/leases/" + a.ID(), tamper(a.Token()), 401, apitype.CodeUnauthorized},
		{"alg none JWT", "GET", "/v1/leases/" + a.ID(), algNone(a.Token()), 401, apitype.CodeUnauthorized},
		{"metrics with a lease token", "GET", "/metrics", a.Token(), 403, apitype.CodeForbidden},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, hdr, body := d.raw(c.method, c.path, c.token, nil, nil)
			wantProblem(t, status, hdr, body, c.status, c.code)
			if c.status == 401 && !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("401 without WWW-Authenticate: Bearer: %v", hdr)
			}
		})
	}
	// Its own lease works with the lease token, and so does info.
	if status, _, body := d.raw("GET", "/v1/leases/"+a.ID(), a.Token(), nil, nil); status != 200 {
		t.Fatalf("own lease with its token: %d %s", status, body)
	}
	if status, _, body := d.raw("GET", "/v1/info", a.Token(), nil, nil); status != 200 {
		t.Fatalf("info with a lease token: %d %s", status, body)
	}
	if status, _, body := d.raw("GET", "/healthz", "", nil, nil); status != 200 || string(body) != "ok\n" {
		t.Fatalf("healthz: %d %q", status, body)
	}
}

func TestOriginPolicy(t *testing.T) {
	d := startDaemon(t, func(c *daemon.Config) { c.AllowedOrigins = []string{"https://console.example"} })
	status, hdr, body := d.raw("GET", "/v1/leases", testToken, nil, map[string]string{"Origin": "https://evil.example"})
	wantProblem(t, status, hdr, body, 403, apitype.CodeForbidden)
	if status, _, body := d.raw("GET", "/v1/leases", testToken, nil, map[string]string{"Origin": "https://console.example"}); status != 200 {
		t.Fatalf("allowed origin: %d %s", status, body)
	}
}

func TestBadRequests(t *testing.T) {
	d := startDaemon(t, func(c *daemon.Config) { c.MaxLeases = 2; c.HTTP.MaxJSONBytes = 4096 })
	t.Run("unknown JSON field", func(t *testing.T) {
		status, hdr, body := d.raw("POST", "/v1/leases", testToken, strings.NewReader(`{"session_id":"x","sesion_ttl":5}`), nil)
		wantProblem(t, status, hdr, body, 400, apitype.CodeInvalidRequest)
	})
	t.Run("missing session id", func(t *testing.T) {
		status, hdr, body := d.raw("POST", "/v1/leases", testToken, strings.NewReader(`{}`), nil)
		wantProblem(t, status, hdr, body, 400, apitype.CodeInvalidRequest)
	})
	t.Run("absurd limits", func(t *testing.T) {
		status, hdr, body := d.raw("POST", "/v1/leases", testToken, jsonBody(apitype.AcquireRequest{SessionID: "big", Limits: apitype.Limits{MemoryBytes: 1 << 50}}), nil)
		wantProblem(t, status, hdr, body, 400, apitype.CodeInvalidRequest)
	})
	t.Run("bad network", func(t *testing.T) {
		for _, bad := range []string{`"bridge"`, `"host"`, `{"egress":"allowlist","allow_out":["10.0.0.1"]}`, `{"egress":"internet","deny_out":["not a rule"]}`} {
			status, hdr, body := d.raw("POST", "/v1/leases", testToken, strings.NewReader(`{"session_id":"net","network":`+bad+`}`), nil)
			wantProblem(t, status, hdr, body, 400, apitype.CodeInvalidNetworkPolicy)
		}
	})
	t.Run("oversized body", func(t *testing.T) {
		big := `{"session_id":"` + strings.Repeat("a", 8192) + `"}`
		status, hdr, body := d.raw("POST", "/v1/leases", testToken, strings.NewReader(big), nil)
		wantProblem(t, status, hdr, body, 413, apitype.CodePayloadTooLarge)
	})
	t.Run("oversized header", func(t *testing.T) {
		status, _, _ := d.raw("GET", "/v1/leases", testToken, nil, map[string]string{"X-Junk": strings.Repeat("j", 64<<10)})
		if status != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d, want 431", status)
		}
	})
	t.Run("unknown lease", func(t *testing.T) {
		status, hdr, body := d.raw("GET", "/v1/leases/lnosuchlease", testToken, nil, nil)
		wantProblem(t, status, hdr, body, 404, apitype.CodeLeaseNotFound)
	})
	t.Run("unknown route", func(t *testing.T) {
		status, hdr, body := d.raw("GET", "/v2/everything", testToken, nil, nil)
		wantProblem(t, status, hdr, body, 404, "not_found")
	})
	t.Run("wrong method", func(t *testing.T) {
		status, hdr, body := d.raw("PUT", "/v1/leases", testToken, nil, nil)
		wantProblem(t, status, hdr, body, 405, apitype.CodeMethodNotAllowed)
		if allow := hdr.Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(allow, "POST") {
			t.Fatalf("Allow: %q", allow)
		}
	})
	t.Run("too many leases", func(t *testing.T) {
		d.acquire("limit-1")
		d.acquire("limit-2")
		_, err := d.client.Acquire(context.Background(), apitype.AcquireRequest{SessionID: "limit-3"})
		if !errors.Is(err, client.ErrLeaseLimit) {
			t.Fatalf("third lease: %v, want ErrLeaseLimit", err)
		}
		status, hdr, body := d.raw("POST", "/v1/leases", testToken, jsonBody(apitype.AcquireRequest{SessionID: "limit-4"}), nil)
		wantProblem(t, status, hdr, body, 429, apitype.CodeLeaseLimit)
	})
}

// A limit the kernel cannot enforce is a 400 naming the field, refused before the lease
// gets a directory, a disk image or a cgroup (cpu_millicores 1 used to reach the cgroup
// and answer 500; a 1 MiB memory limit formatted a disk before it was refused).
func TestLimitsUnderTheKernelsFloorMakeNothing(t *testing.T) {
	needRoot(t)
	d := startDaemon(t)
	made := func() []string {
		var paths []string
		for _, pattern := range []string{
			filepath.Join(d.cfg.WorkRoot, "l*"),
			filepath.Join(d.cfg.WorkRoot, ".disk", "*.img"),
		} {
			m, _ := filepath.Glob(pattern)
			paths = append(paths, m...)
		}
		for _, p := range daemontest.CgroupParents(d.cfg.CgroupParent) {
			m, _ := filepath.Glob(p + "/*/")
			paths = append(paths, m...)
		}
		return paths
	}
	before := made()
	for _, tc := range []struct {
		limits apitype.Limits
		field  string
	}{
		{apitype.Limits{MemoryBytes: 1 << 20}, "memory_bytes"},
		{apitype.Limits{CPUMillicores: 1}, "cpu_millicores"},
	} {
		status, hdr, body := d.raw("POST", "/v1/leases", testToken, jsonBody(apitype.AcquireRequest{SessionID: "floor", Limits: tc.limits}), nil)
		wantProblem(t, status, hdr, body, 400, apitype.CodeInvalidRequest)
		if !strings.Contains(string(body), tc.field) {
			t.Errorf("%+v refused without naming %s: %s", tc.limits, tc.field, body)
		}
	}
	if after := made(); len(after) != len(before) {
		t.Fatalf("refused requests made %v (before: %v)", after, before)
	}
}

func TestMetricsAndInfo(t *testing.T) {
	d := startDaemon(t)
	d.acquire("metrics")
	info := must(d.client.Info(context.Background()))(t)
	if info.Version != "test" || !info.Capabilities.Exec || info.Capabilities.Scripts {
		t.Fatalf("info: %+v", info)
	}
	if info.Capabilities.Isolation != isolation() {
		t.Fatalf("info says isolation %q, want %q", info.Capabilities.Isolation, isolation())
	}
	if !info.Capabilities.Seccomp {
		t.Fatal("info says seccomp is off; SIDECAR_SECCOMP defaults to strict")
	}
	status, _, body := d.raw("GET", "/metrics", testToken, nil, nil)
	if status != 200 {
		t.Fatalf("metrics: %d", status)
	}
	wants := []string{`sidecar_leases{state="active"} 1`, `sidecar_leases{state="retiring"} 0`, `sidecar_lease_events_total{event="created"} 1`, "sidecar_http_request_duration_seconds_bucket",
		fmt.Sprintf("sidecar_landlock_abi %d", info.Capabilities.Landlock)}
	for _, l := range info.Capabilities.Layers {
		wants = append(wants, fmt.Sprintf(`sidecar_isolation_layer{layer=%q} 1`, l))
	}
	if isolation() == "strict" && len(info.Capabilities.Layers) < 4 {
		t.Errorf("strict daemon reports layers %q", info.Capabilities.Layers)
	}
	for _, want := range wants {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// An operator's Landlock floor above what lease processes would get refuses to start,
// naming the Linux release that has it (the cap stands in for an older kernel here).
func TestLandlockFloorRefusesToStart(t *testing.T) {
	if landlockKernelABI() < 3 {
		t.Skipf("needs Landlock ABI >= 3 to cap below a floor of 3; this kernel has %d", landlockKernelABI())
	}
	d := startDaemon(t)
	cfg := d.cfg
	d.stop()
	cfg.MinLandlockABI, cfg.LandlockMaxABI = 3, 2
	dd, err := daemon.Start(context.Background(), cfg)
	if err == nil {
		dd.Close(context.Background())
		t.Fatal("started below the floor")
	}
	if !strings.Contains(err.Error(), "Landlock ABI >= 3 as required (Linux 6.2 or later") {
		t.Fatalf("refusal does not name the kernel needed: %v", err)
	}
}

// Two daemons on one host: a second one with its own state dir and cgroup parent starts
// beside the first, and one on the parent the first holds is refused, naming it, before it
// sweeps anything: the first one's lease keeps running through both.
func TestTwoDaemonsOneHost(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	a := startDaemon(t)
	la := a.acquire("first")
	// A background process of the lease: its host pid is what the sweep would kill.
	must(la.Start(ctx, apitype.StartRequest{Argv: []string{"/bin/sh", "-c", "echo $$ > sleeper.pid; exec sleep 300"}}))(t)
	var pid int
	waitFor(t, "the lease's background process", 10*time.Second, func() bool {
		b, err := la.ReadFile(ctx, "sleeper.pid")
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0
	})
	alive := func(when string) {
		t.Helper()
		if err := syscall.Kill(pid, 0); err != nil {
			t.Fatalf("%s: the first daemon's lease process %d is gone: %v", when, pid, err)
		}
		if r := must(la.Exec(ctx, sh(`echo ok`)))(t); r.Stdout != "ok\n" {
			t.Fatalf("%s: the first daemon's lease: %+v", when, r)
		}
	}

	b := startDaemon(t, func(c *daemon.Config) {
		c.CgroupParent += "-b"
		if c.UIDFirst != 0 {
			c.UIDFirst, c.UIDLast = 236000, 236999 // its own uids: overlapping ones are refused below
		}
	})
	b.acquire("second")
	alive("a second daemon started")

	if a.cfg.UIDFirst != 0 {
		cfg := b.cfg
		cfg.StateDir = stateDir(t)
		cfg.WorkRoot = filepath.Join(cfg.StateDir, "leases")
		cfg.ListenAddr = "127.0.0.1:0"
		cfg.CgroupParent += "-c"
		cfg.UIDFirst, cfg.UIDLast = a.cfg.UIDLast, a.cfg.UIDLast+10
		// The refused daemon made its cgroup parent before the lease table refused the
		// range; a parent outlives a daemon by design (its leases survive a restart).
		t.Cleanup(func() { _ = daemontest.RemoveCgroupParent(cfg.CgroupParent) })
		if dd, err := daemon.Start(ctx, cfg); err == nil {
			dd.Close(ctx)
			t.Fatal("a daemon started with uids a running one hands out")
		} else if !errors.Is(err, lease.ErrUIDRangeOwned) || !strings.Contains(err.Error(), a.cfg.StateDir) {
			t.Fatalf("uid refusal does not name the holder: %v", err)
		}
	}

	cfg := b.cfg
	cfg.StateDir = stateDir(t)
	cfg.WorkRoot = filepath.Join(cfg.StateDir, "leases")
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.CgroupParent = a.cfg.CgroupParent
	if dd, err := daemon.Start(ctx, cfg); err == nil {
		dd.Close(ctx)
		t.Fatal("a daemon started on the cgroup parent a running one holds")
	} else if !errors.Is(err, sandbox.ErrParentOwned) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d with state dir %s", os.Getpid(), a.cfg.StateDir)) {
		t.Fatalf("refusal does not name the holder: %v", err)
	}
	alive("a daemon on the same parent was refused")
}

// A worker holding only a lease token keeps working while the owner renews the lease: the
// daemon hands it a fresh token on its next request, so it is not locked out at the first
// token's expiry.
func TestWorkerTokenOutlivesOwnerRenewals(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	owner := d.acquireOnce(apitype.AcquireRequest{SessionID: "owner-renews", TTLSeconds: 60})
	first := owner.Token()
	worker := d.newClient(first).OpenLease(owner.ID(), first)
	for round := range 4 {
		d.clock.Advance(40 * time.Second)
		must(owner.Renew(ctx, time.Minute))(t)
		res := must(worker.Exec(ctx, apitype.ExecRequest{Argv: []string{"echo", "ok"}}))(t)
		if res.ExitCode != 0 || res.Stdout != "ok\n" {
			t.Fatalf("round %d: worker exec: %+v", round, res)
		}
	}
	// 160 s have passed: the first token expired at 60 s, the worker's is fresh.
	if _, err := d.newClient(first).OpenLease(owner.ID(), first).Get(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("the first token after its expiry: %v, want ErrUnauthorized", err)
	}
	if worker.Token() == first {
		t.Fatal("the worker still holds its first token")
	}
	// An idle worker refreshes explicitly: a renewal, then RefreshToken, then past the
	// previous token's expiry.
	d.clock.Advance(40 * time.Second)
	must(owner.Renew(ctx, time.Minute))(t)
	if err := worker.RefreshToken(ctx); err != nil {
		t.Fatal(err)
	}
	d.clock.Advance(40 * time.Second)
	if _, err := worker.Get(ctx); err != nil {
		t.Fatalf("after RefreshToken and past the old expiry: %v", err)
	}
	// A token the lease has not outlived gets no new one: no header on every request.
	status, hdr, _ := d.raw("GET", "/v1/leases/"+owner.ID(), worker.Token(), nil, nil)
	if status != 200 || hdr.Get(apitype.HeaderLeaseToken) != "" {
		t.Fatalf("status %d, X-Lease-Token %q on a current token", status, hdr.Get(apitype.HeaderLeaseToken))
	}
}
