package lease

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"
)

// runManager runs m.Run until the test ends.
func runManager(t *testing.T, m *Manager) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx, time.Hour); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitSpares waits (10 s at most) for n spares, and returns their ids.
func waitSpares(t *testing.T, m *Manager, n int) []string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		m.mu.RLock()
		var ids []string
		for _, l := range m.spares {
			ids = append(ids, l.ID)
		}
		making := len(m.making)
		m.mu.RUnlock()
		if len(ids) == n && making == 0 {
			return ids
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d spares (%d being made), want %d", len(ids), making, n)
		}
	}
}

// TestSpareServesDefaultAcquire: a spare is made ahead, provisioned and owned but no lease;
// a default acquire gets it without provisioning anything, and another is made; an acquire
// of another shape that needs the spare's uid takes it down; DropSpares removes the rest.
func TestSpareServesDefaultAcquire(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Spares, c.UIDFirst, c.UIDLast = 1, 5000, 5001 })
	m := e.open()
	runManager(t, m)
	spare := waitSpares(t, m, 1)[0]
	if p, _ := e.prov.counts(spare); p != 1 {
		t.Fatalf("spare provisioned %d times, want 1", p)
	}
	if got := m.List(); len(got) != 0 {
		t.Fatalf("a spare is listed: %v", got)
	}
	if _, err := m.Get(spare); err == nil {
		t.Fatal("Get finds a spare")
	}
	if removed, err := m.Orphans(t.Context()); err != nil || len(removed) != 0 {
		t.Fatalf("Orphans: %v %v: a spare is not an orphan", removed, err)
	}

	l := mustAcquire(t, m, Request{SessionID: "agent", Labels: map[string]string{"k": "v"}})
	if l.ID != spare {
		t.Fatalf("default acquire made %s; want the spare %s", l.ID, spare)
	}
	if p, _ := e.prov.counts(spare); p != 1 {
		t.Fatalf("the spare was provisioned again (%d)", p)
	}
	if l.SessionID != "agent" || l.Labels["k"] != "v" || !l.ExpiresAt.Equal(e.clock.Now().Add(DefaultTTL)) {
		t.Fatalf("lease from a spare: %+v", l)
	}
	if got, err := m.Get(l.ID); err != nil || got.SessionID != "agent" {
		t.Fatalf("Get: %+v %v", got, err)
	}
	if k := e.eventKinds(l.ID); !slices.Equal(k, []string{EventCreated}) {
		t.Fatalf("events %v", k)
	}
	next := waitSpares(t, m, 1)[0]
	if next == spare {
		t.Fatal("no new spare")
	}

	// Both uids are held now: a lease of another shape takes the spare's.
	other := mustAcquire(t, m, Request{SessionID: "other", Limits: Limits{Pids: 7}})
	if other.ID == next {
		t.Fatal("a request of another shape got the spare")
	}
	if _, torn := e.prov.counts(next); torn != 1 {
		t.Fatalf("the spare in the way torn down %d times, want 1", torn)
	}
	m.WaitRetired()
	assertGone(t, e.cfg.WorkRoot+"/"+next)
	waitSpares(t, m, 0)

	// A release frees a uid: a spare is made again (at the next wake).
	if err := m.Release(t.Context(), l.ID); err != nil {
		t.Fatal(err)
	}
	m.WaitRetired()
	m.wakeSpares()
	last := waitSpares(t, m, 1)[0]
	if err := m.DropSpares(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, torn := e.prov.counts(last); torn != 1 || m.Spares() != 0 {
		t.Fatalf("DropSpares: torn down %d, %d spares left", torn, m.Spares())
	}
	assertGone(t, e.cfg.WorkRoot+"/"+last)
}

// TestSpareIsAnOrphanAfterACrash: no journal records a spare, so a daemon that stopped
// without dropping it finds its directory an orphan at the next start.
func TestSpareIsAnOrphanAfterACrash(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Spares = 1 })
	m, err := Open(t.Context(), e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { m.Run(ctx, time.Hour); close(done) }()
	spare := waitSpares(t, m, 1)[0]
	cancel()
	<-done
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	m2 := e.open()
	if len(m2.List()) != 0 {
		t.Fatalf("the spare came back as a lease: %v", m2.List())
	}
	removed, err := m2.Orphans(t.Context())
	if err != nil || !slices.Equal(removed, []string{spare}) {
		t.Fatalf("Orphans = %v, %v; want the spare %s", removed, err, spare)
	}
	if _, err := os.Stat(e.cfg.WorkRoot + "/" + spare); !os.IsNotExist(err) {
		t.Fatalf("spare directory: %v", err)
	}
}

// TestSpareOnAnImage: a spare is made on the default image; one whose image was replaced
// since is taken down, and the acquire gets a lease made on the spot.
func TestSpareOnAnImage(t *testing.T) {
	current := true
	var mu sync.Mutex
	e := newEnv(t, func(c *Config) {
		c.Spares, c.DefaultImage = 1, "base"
		c.CheckImage = func(string) error { return nil }
		c.SpareCurrent = func(Lease) bool { mu.Lock(); defer mu.Unlock(); return current }
	})
	m := e.open()
	runManager(t, m)
	spare := waitSpares(t, m, 1)[0]
	if m.SparesOn("base") != 1 || m.SparesOn("") != 0 {
		t.Fatalf("SparesOn: base %d, host %d", m.SparesOn("base"), m.SparesOn(""))
	}
	if l := mustAcquire(t, m, Request{SessionID: "a"}); l.ID != spare || l.Image != "base" {
		t.Fatalf("acquire: %s on %q; want the spare %s on base", l.ID, l.Image, spare)
	}
	stale := waitSpares(t, m, 1)[0]
	mu.Lock()
	current = false
	mu.Unlock()
	l := mustAcquire(t, m, Request{SessionID: "b"})
	if l.ID == stale {
		t.Fatal("a spare on a replaced image was handed out")
	}
	if p, _ := e.prov.counts(l.ID); p != 1 {
		t.Fatalf("the lease made instead was provisioned %d times", p)
	}
	m.WaitRetired()
	if _, torn := e.prov.counts(stale); torn != 1 {
		t.Fatalf("the stale spare torn down %d times, want 1", torn)
	}
	assertGone(t, e.cfg.WorkRoot+"/"+stale)
}

// TestSparesOnlyWhereTheyFit: none past the lease limit, and the count bounded by
// MaxLeases.
func TestSparesOnlyWhereTheyFit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Spares, c.MaxLeases = 1, 1 })
	m := e.open()
	runManager(t, m)
	waitSpares(t, m, 1)
	l := mustAcquire(t, m, Request{SessionID: "only"})
	if made, err := m.makeSpare(t.Context(), Request{}); made || err != nil {
		t.Fatalf("a spare made with the only lease slot held: %v %v", made, err)
	}
	if err := m.Release(t.Context(), l.ID); err != nil {
		t.Fatal(err)
	}
	e = newEnv(t, func(c *Config) { c.Spares, c.MaxLeases = 3, 2 })
	if _, err := Open(t.Context(), e.cfg); err == nil {
		t.Fatal("Spares over MaxLeases accepted")
	}
}

// TestRefillWaitsForAQuietDaemon: the next spare waits until spareQuiet has passed since
// the last request it waits out, and never past spareAfterTake.
func TestRefillWaitsForAQuietDaemon(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		name        string
		since, left time.Duration
		want        time.Duration
	}{
		{"quiet", spareQuiet, 200 * ms, 0},
		{"quiet longer", spareQuiet + 5*ms, 200 * ms, 0},
		{"busy: the rest of the quiet wait", 30 * ms, 200 * ms, spareQuiet - 30*ms},
		{"busy, the latest near", 0, 10 * ms, 10 * ms},
		{"busy, the latest passed", 0, -ms, 0},
		{"a clock jump back", -time.Hour, 200 * ms, 200 * ms},
	} {
		if got := refillWait(c.since, c.left); got != c.want {
			t.Errorf("%s: refillWait = %v, want %v", c.name, got, c.want)
		}
	}
}
