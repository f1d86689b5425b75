package lease

import (
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"

	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAcquireCreatesLease(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.DefaultLimits = Limits{MemoryBytes: 1 << 30, Pids: 100}
	})
	m := e.open()
	now := e.clock.Now()

	l := mustAcquire(t, m, Request{SessionID: "s1", Limits: Limits{Pids: 50}, Labels: map[string]string{"app": "x"}})

	if !validID(l.ID) || !strings.HasPrefix(l.ID, "l") || len(l.ID) != 27 {
		t.Errorf("id %q: want l + 26 base32 chars", l.ID)
	}
	if l.SessionID != "s1" || l.Network.Egress != netpolicy.EgressInternet || l.Labels["app"] != "x" {
		t.Errorf("lease = %+v", l)
	}
	if want := (Limits{MemoryBytes: 1 << 30, Pids: 50}); l.Limits != want {
		t.Errorf("limits = %+v, want %+v (request fields win, zero fields take defaults)", l.Limits, want)
	}
	if !l.CreatedAt.Equal(now) || !l.ExpiresAt.Equal(now.Add(DefaultTTL)) || !l.LastActivityAt.Equal(now) {
		t.Errorf("times = %v %v %v, want created now and expiring after the default TTL", l.CreatedAt, l.ExpiresAt, l.LastActivityAt)
	}
	if l.UID != 0 || l.GID != 0 {
		t.Errorf("uid/gid = %d/%d without a uid range, want 0", l.UID, l.GID)
	}
	assertMode(t, e.cfg.WorkRoot, 0o711)
	assertMode(t, l.Dir, 0o711)
	for _, d := range []string{l.Workdir(), l.TmpDir(), l.UploadsDir()} {
		assertMode(t, d, 0o700)
	}
	if p, _ := e.prov.counts(l.ID); p != 1 {
		t.Errorf("Provision called %d times, want 1", p)
	}
	if got := e.eventKinds(l.ID); len(got) != 1 || got[0] != EventCreated {
		t.Errorf("events = %v, want [created]", got)
	}
	if logs := e.logs.String(); !strings.Contains(logs, "lease created") || !strings.Contains(logs, l.ID) || !strings.Contains(logs, "session=s1") {
		t.Errorf("no audit line for the new lease in logs:\n%s", logs)
	}
	got, err := m.Get(l.ID)
	if err != nil || got.ID != l.ID {
		t.Errorf("Get = %v, %v", got.ID, err)
	}

	// The caller's copy shares nothing with the manager's.
	l.Labels["app"] = "changed"
	if got, _ := m.Get(l.ID); got.Labels["app"] != "x" {
		t.Errorf("a caller changed the manager's labels")
	}
}

func TestAcquireIsIdempotentBySession(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	first := mustAcquire(t, m, Request{SessionID: "s1", TTL: time.Minute})

	e.clock.Advance(30 * time.Second)
	again, created, err := m.Acquire(context.Background(), Request{SessionID: "s1", TTL: time.Hour})
	if err != nil || created {
		t.Fatalf("re-acquire: created=%v err=%v, want the existing lease", created, err)
	}
	if again.ID != first.ID || !again.ExpiresAt.Equal(first.ExpiresAt) {
		t.Errorf("re-acquire returned %s expiring %v, want %s unchanged at %v", again.ID, again.ExpiresAt, first.ID, first.ExpiresAt)
	}
	other := mustAcquire(t, m, Request{SessionID: "s2"})
	if other.ID == first.ID {
		t.Error("another session got the same lease")
	}

	// Once the session's lease has expired, the session gets a new one.
	e.clock.Advance(time.Minute)
	fresh := mustAcquire(t, m, Request{SessionID: "s1"})
	if fresh.ID == first.ID {
		t.Error("an expired lease was handed out again")
	}
}

func TestAcquireConcurrentSameSession(t *testing.T) {
	e := newEnv(t)
	e.prov.gate = make(chan struct{})
	e.prov.entered = make(chan string, 16)
	m := e.open()

	const n = 16
	var wg sync.WaitGroup
	leases := make([]Lease, n)
	created := make([]bool, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { leases[i], created[i], errs[i] = m.Acquire(context.Background(), Request{SessionID: "same"}) })
	}
	// The first caller is now inside Provision with the session marked busy; the others
	// must wait for it rather than provision a lease of their own (which would show as a
	// second entry, or as several leases below).
	<-e.prov.entered
	runtime.Gosched()
	close(e.prov.gate)
	wg.Wait()

	nCreated := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Acquire %d: %v", i, errs[i])
		}
		if leases[i].ID != leases[0].ID {
			t.Fatalf("Acquire %d returned %s, Acquire 0 returned %s", i, leases[i].ID, leases[0].ID)
		}
		if created[i] {
			nCreated++
		}
	}
	if nCreated != 1 {
		t.Errorf("%d callers were told they created the lease, want 1", nCreated)
	}
	if p, _ := e.prov.counts(leases[0].ID); p != 1 || len(m.List()) != 1 || len(e.workRootNames()) != 1 {
		t.Errorf("provisioned %d times, %d leases, %d dirs; want 1 of each", p, len(m.List()), len(e.workRootNames()))
	}
}

func TestAcquireRejectsBadRequests(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MaxTTL = time.Hour
		c.MaxLimits = Limits{MemoryBytes: 1 << 30, Pids: 512}
	})
	m := e.open()
	manyLabels := map[string]string{}
	for i := range MaxLabels + 1 {
		manyLabels[strings.Repeat("k", i+1)] = "v"
	}
	for _, tc := range []struct {
		name string
		r    Request
	}{
		{"no session", Request{}},
		{"session too long", Request{SessionID: strings.Repeat("s", MaxSessionIDLen+1)}},
		{"session with slash", Request{SessionID: "a/b"}},
		{"session with newline", Request{SessionID: "a\nb"}},
		{"session not utf-8", Request{SessionID: "a\xffb"}},
		{"ttl over max", Request{SessionID: "s", TTL: time.Hour + time.Second}},
		{"negative ttl", Request{SessionID: "s", TTL: -time.Second}},
		{"unknown network", Request{SessionID: "s", Network: netpolicy.Policy{Egress: "bridge"}}},
		{"too many labels", Request{SessionID: "s", Labels: manyLabels}},
		{"label key too long", Request{SessionID: "s", Labels: map[string]string{strings.Repeat("k", MaxLabelKeyLen+1): "v"}}},
		{"empty label key", Request{SessionID: "s", Labels: map[string]string{"": "v"}}},
		{"label value too long", Request{SessionID: "s", Labels: map[string]string{"k": strings.Repeat("v", MaxLabelValueLen+1)}}},
		{"memory over max", Request{SessionID: "s", Limits: Limits{MemoryBytes: 1<<30 + 1}}},
		{"negative pids", Request{SessionID: "s", Limits: Limits{Pids: -1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := m.Acquire(context.Background(), tc.r)
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
		})
	}
	if n := len(e.workRootNames()); n != 0 {
		t.Errorf("%d directories left by refused requests", n)
	}

	// The bounds themselves are allowed.
	l := mustAcquire(t, m, Request{
		SessionID: strings.Repeat("é", MaxSessionIDLen), TTL: time.Hour, Network: netpolicy.Policy{Egress: netpolicy.EgressNone},
		Limits: Limits{MemoryBytes: 1 << 30, CPUMillicores: MaxCPUMillicores, Pids: 512},
		Labels: map[string]string{strings.Repeat("k", MaxLabelKeyLen): strings.Repeat("v", MaxLabelValueLen)},
	})
	if !l.ExpiresAt.Equal(e.clock.Now().Add(time.Hour)) || l.Network.Egress != netpolicy.EgressNone {
		t.Errorf("lease at the bounds = %+v", l)
	}
}

// A limit the kernel cannot enforce (a 1 MiB memory cgroup, a CFS quota under 1 ms per
// period) is refused, naming the field and its bound, before any directory, disk or
// cgroup is made: the disk and the provisioner are never called.
func TestAcquireRefusesLimitsOutsideTheKernelsBounds(t *testing.T) {
	d := &fakeDisk{t: t}
	e := newEnv(t, withDisk(d))
	m := e.open()
	before := d.snapshot()
	for _, tc := range []struct {
		limits Limits
		want   string
	}{
		{Limits{MemoryBytes: 1 << 20}, "memory_bytes 1048576 under the minimum 4194304"},
		{Limits{MemoryBytes: MinMemoryBytes - 1}, "memory_bytes"},
		{Limits{CPUMillicores: 1}, "cpu_millicores 1 under the minimum 10"},
		{Limits{CPUMillicores: MaxCPUMillicores + 1}, "cpu_millicores 1024001 over the kernel's maximum"},
		{Limits{Pids: MaxPids + 1}, "pids"},
	} {
		_, _, err := m.Acquire(context.Background(), Request{SessionID: "s", Limits: tc.limits})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Acquire(%+v) = %v, want ErrInvalid saying %q", tc.limits, err, tc.want)
		}
	}
	if ops := d.snapshot(); len(ops) != len(before) {
		t.Errorf("disk calls for refused requests: %q", ops[len(before):])
	}
	if n := len(e.workRootNames()); n != 0 {
		t.Errorf("%d directories left by refused requests", n)
	}
	e.prov.mu.Lock()
	calls := len(e.prov.provisioned) + len(e.prov.tornDown)
	e.prov.mu.Unlock()
	if calls != 0 {
		t.Errorf("provisioner called %d times for refused requests", calls)
	}
	// The bounds themselves are allowed.
	mustAcquire(t, m, Request{SessionID: "s", Limits: Limits{MemoryBytes: MinMemoryBytes, CPUMillicores: MinCPUMillicores}})
}

func TestConfigDefaultsAndErrors(t *testing.T) {
	c, err := Config{StateDir: "/s", WorkRoot: "/w"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.DefaultTTL != 15*time.Minute || c.MaxTTL != 24*time.Hour || c.MaxLeases != 64 {
		t.Errorf("defaults = %v %v %d", c.DefaultTTL, c.MaxTTL, c.MaxLeases)
	}
	for _, tc := range []struct {
		name string
		c    Config
	}{
		{"relative state dir", Config{StateDir: "s", WorkRoot: "/w"}},
		{"no work root", Config{StateDir: "/s"}},
		{"default ttl over max", Config{StateDir: "/s", WorkRoot: "/w", DefaultTTL: 2 * time.Hour, MaxTTL: time.Hour}},
		{"negative max leases", Config{StateDir: "/s", WorkRoot: "/w", MaxLeases: -1}},
		{"default limits over max", Config{StateDir: "/s", WorkRoot: "/w", DefaultLimits: Limits{Pids: 10}, MaxLimits: Limits{Pids: 5}}},
		{"default memory under the kernel's floor", Config{StateDir: "/s", WorkRoot: "/w", DefaultLimits: Limits{MemoryBytes: 1 << 20}}},
		{"default cpu under the kernel's floor", Config{StateDir: "/s", WorkRoot: "/w", DefaultLimits: Limits{CPUMillicores: 1}}},
		{"uid range with root", Config{StateDir: "/s", WorkRoot: "/w", UIDFirst: 0, UIDLast: 10}},
		{"uid range reversed", Config{StateDir: "/s", WorkRoot: "/w", UIDFirst: 10, UIDLast: 9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Open(context.Background(), tc.c); err == nil {
				t.Error("Open accepted a bad config")
			}
		})
	}
}

func TestMaxLeases(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxLeases = 2 })
	m := e.open()
	a := mustAcquire(t, m, Request{SessionID: "a", TTL: time.Minute})
	mustAcquire(t, m, Request{SessionID: "b", TTL: time.Hour})

	if _, _, err := m.Acquire(context.Background(), Request{SessionID: "c"}); !errors.Is(err, ErrLimit) {
		t.Fatalf("third lease: err = %v, want ErrLimit", err)
	}
	// The session that holds a lease still gets it back at the limit.
	if l, created, err := m.Acquire(context.Background(), Request{SessionID: "a"}); err != nil || created || l.ID != a.ID {
		t.Errorf("re-acquire at the limit: %v %v %v", l.ID, created, err)
	}
	// An expired lease does not hold its slot: Acquire reaps it.
	e.clock.Advance(2 * time.Minute)
	c := mustAcquire(t, m, Request{SessionID: "c"})
	if _, err := m.Get(a.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("expired lease after acquire at the limit: %v, want reaped", err)
	}
	if got := e.eventKinds(a.ID); len(got) != 2 || got[1] != EventExpired {
		t.Errorf("events of the reaped lease = %v", got)
	}
	if err := m.Release(context.Background(), c.ID); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, m, Request{SessionID: "d"})
}

func TestUIDAllocation(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.UIDFirst, c.UIDLast = 200000, 200002 })
	m := e.open()
	ctx := context.Background()

	a := mustAcquire(t, m, Request{SessionID: "a"})
	b := mustAcquire(t, m, Request{SessionID: "b"})
	if a.UID != 200000 || a.GID != a.UID || b.UID != 200001 || b.GID != b.UID {
		t.Fatalf("uids a=%d/%d b=%d/%d, want 200000 and 200001 with gid = uid", a.UID, a.GID, b.UID, b.GID)
	}
	if err := m.Release(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	// Round robin: the uid just freed is handed out last.
	c := mustAcquire(t, m, Request{SessionID: "c"})
	d := mustAcquire(t, m, Request{SessionID: "d"})
	if c.UID != 200002 || d.UID != 200000 {
		t.Errorf("uids after a release: c=%d d=%d, want 200002 then the reused 200000", c.UID, d.UID)
	}
	if _, _, err := m.Acquire(ctx, Request{SessionID: "e"}); !errors.Is(err, ErrLimit) {
		t.Errorf("acquire with the uid range used up: %v, want ErrLimit", err)
	}
	if n := len(e.workRootNames()); n != 3 {
		t.Errorf("%d lease dirs, want 3", n)
	}
}

func TestAcquireRollsBackWhenProvisionFails(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.UIDFirst, c.UIDLast = 300000, 300000 })
	m := e.open()
	boom := errors.New("cgroup: no space")
	e.prov.setFail(boom, nil)

	_, _, err := m.Acquire(context.Background(), Request{SessionID: "s"})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the provisioner's", err)
	}
	if n := len(e.workRootNames()); n != 0 {
		t.Errorf("%d directories left behind: %v", n, e.workRootNames())
	}
	if len(m.List()) != 0 {
		t.Errorf("stray lease: %+v", m.List())
	}
	e.mu.Lock()
	nEvents := len(e.events)
	e.mu.Unlock()
	if nEvents != 0 {
		t.Errorf("%d events for a lease that never existed", nEvents)
	}
	e.prov.mu.Lock()
	torn := len(e.prov.tornDown)
	e.prov.mu.Unlock()
	if torn != 1 {
		t.Errorf("Teardown called for %d leases, want the failed one", torn)
	}

	// Its uid (the only one) and its session are free again.
	e.prov.setFail(nil, nil)
	l := mustAcquire(t, m, Request{SessionID: "s"})
	if l.UID != 300000 {
		t.Errorf("uid = %d, want the one freed by the rollback", l.UID)
	}
}

func TestAcquireRollsBackWhenCanceled(t *testing.T) {
	e := newEnv(t)
	e.prov.gate = make(chan struct{}) // never opens: Provision waits for the context
	m := e.open()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := m.Acquire(ctx, Request{SessionID: "s"})
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if n := len(e.workRootNames()); n != 0 || len(m.List()) != 0 {
		t.Errorf("left %d dirs and %d leases", n, len(m.List()))
	}
}
