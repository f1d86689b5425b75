package lease

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

func TestRenew(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxTTL = 2 * time.Hour })
	m := e.open()
	ctx := context.Background()
	l := mustAcquire(t, m, Request{SessionID: "s", TTL: time.Minute})

	e.clock.Advance(50 * time.Second)
	r, err := m.Renew(ctx, l.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if want := e.clock.Now().Add(time.Hour); !r.ExpiresAt.Equal(want) || !r.LastActivityAt.Equal(e.clock.Now()) {
		t.Errorf("renewed: expires %v, last activity %v; want %v and now", r.ExpiresAt, r.LastActivityAt, want)
	}
	if r, _ := m.Renew(ctx, l.ID, 0); !r.ExpiresAt.Equal(e.clock.Now().Add(DefaultTTL)) {
		t.Errorf("renew with ttl 0 expires %v, want the default TTL from now", r.ExpiresAt)
	}
	if _, err := m.Renew(ctx, l.ID, 3*time.Hour); !errors.Is(err, ErrInvalid) {
		t.Errorf("renew over max ttl: %v, want ErrInvalid", err)
	}
	if _, err := m.Renew(ctx, "lnosuchleaseaaaaaaaaaaaaaaa", time.Minute); !errors.Is(err, ErrNotFound) {
		t.Errorf("renew unknown: %v, want ErrNotFound", err)
	}
	if got := e.eventKinds(l.ID); len(got) != 3 || got[1] != EventRenewed || got[2] != EventRenewed {
		t.Errorf("events = %v, want created, renewed, renewed", got)
	}
}

func TestExpiry(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	ctx := context.Background()
	l := mustAcquire(t, m, Request{SessionID: "s", TTL: time.Minute})
	keep := mustAcquire(t, m, Request{SessionID: "keep", TTL: time.Hour})

	e.clock.Advance(time.Minute - time.Nanosecond)
	if _, err := m.Get(l.ID); err != nil {
		t.Fatalf("Get just before expiry: %v", err)
	}
	e.clock.Advance(time.Nanosecond)
	got, err := m.Get(l.ID)
	if !errors.Is(err, ErrExpired) || got.ID != l.ID {
		t.Fatalf("Get at expiry = %q, %v; want the lease with ErrExpired", got.ID, err)
	}
	if _, err := m.Renew(ctx, l.ID, time.Hour); !errors.Is(err, ErrExpired) {
		t.Errorf("renew expired: %v, want ErrExpired", err)
	}
	if n := len(m.List()); n != 2 {
		t.Errorf("List holds %d leases, want the expired one until it is reaped", n)
	}

	reaped, err := m.Reap(ctx)
	if err != nil || len(reaped) != 1 || reaped[0].ID != l.ID {
		t.Fatalf("Reap = %v, %v; want the expired lease", reaped, err)
	}
	m.WaitRetired()
	assertGone(t, l.Dir)
	if _, torn := e.prov.counts(l.ID); torn != 1 {
		t.Errorf("Teardown called %d times, want 1", torn)
	}
	if got := e.eventKinds(l.ID); len(got) != 2 || got[1] != EventExpired {
		t.Errorf("events = %v, want created, expired", got)
	}
	if _, err := m.Get(l.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get reaped: %v, want ErrNotFound", err)
	}
	if err := m.Release(ctx, l.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Release reaped: %v, want ErrNotFound", err)
	}
	if _, err := m.Get(keep.ID); err != nil {
		t.Errorf("the active lease was touched by Reap: %v", err)
	}
	if reaped, err := m.Reap(ctx); err != nil || len(reaped) != 0 {
		t.Errorf("second Reap = %v, %v; want nothing", reaped, err)
	}
}

func TestRelease(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	ctx := context.Background()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	if err := os.WriteFile(filepath.Join(l.Workdir(), "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	if err := m.Release(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	m.WaitRetired()
	assertGone(t, l.Dir)
	if _, torn := e.prov.counts(l.ID); torn != 1 {
		t.Errorf("Teardown called %d times, want 1", torn)
	}
	if got := e.eventKinds(l.ID); len(got) != 2 || got[1] != EventReleased {
		t.Errorf("events = %v, want created, released", got)
	}
	if err := m.Release(ctx, l.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Release: %v, want ErrNotFound", err)
	}
	// The session is free for a new lease.
	if n := mustAcquire(t, m, Request{SessionID: "s"}); n.ID == l.ID {
		t.Error("released lease came back")
	}
}

func TestReleaseKeepsLeaseWhenTeardownFails(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	ctx := context.Background()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	boom := errors.New("cgroup busy")
	e.prov.setFail(nil, boom)

	if err := m.Release(ctx, l.ID); !errors.Is(err, boom) {
		t.Fatalf("Release = %v, want the teardown error", err)
	}
	if _, err := m.Get(l.ID); err != nil {
		t.Errorf("after a failed release the lease should stay for a retry: %v", err)
	}
	assertMode(t, l.Workdir(), 0o700)
	if got, created, _ := m.Acquire(ctx, Request{SessionID: "s"}); created || got.ID != l.ID {
		t.Errorf("the session lost its lease on a failed release")
	}

	e.prov.setFail(nil, nil)
	if err := m.Release(ctx, l.ID); err != nil {
		t.Fatalf("retry: %v", err)
	}
	m.WaitRetired()
	assertGone(t, l.Dir)
}

// Release racing Reap (and another Release) releases once.
func TestReleaseRacesReap(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	ctx := context.Background()
	var ids []string
	for i := range 20 {
		ids = append(ids, mustAcquire(t, m, Request{SessionID: string(rune('a' + i)), TTL: time.Minute}).ID)
	}
	e.clock.Advance(time.Hour)

	var wg sync.WaitGroup
	released := make([]bool, len(ids))
	var reaped []Lease
	wg.Go(func() {
		var err error
		if reaped, err = m.Reap(ctx); err != nil {
			t.Errorf("Reap: %v", err)
		}
	})
	for i, id := range ids {
		for range 2 {
			wg.Go(func() {
				err := m.Release(ctx, id)
				if err != nil && !errors.Is(err, ErrNotFound) {
					t.Errorf("Release: %v", err)
				}
				if err == nil {
					released[i] = true // at most one goroutine per id succeeds, or the counts below fail
				}
			})
		}
	}
	wg.Wait()
	m.WaitRetired()

	nReaped := map[string]bool{}
	for _, l := range reaped {
		nReaped[l.ID] = true
	}
	for i, id := range ids {
		if _, torn := e.prov.counts(id); torn != 1 {
			t.Errorf("lease %s torn down %d times, want 1", id, torn)
		}
		if released[i] == nReaped[id] {
			t.Errorf("lease %s: released by Release %v, by Reap %v; want exactly one", id, released[i], nReaped[id])
		}
		if got := e.eventKinds(id); len(got) != 2 {
			t.Errorf("lease %s events = %v, want created and one end", id, got)
		}
	}
	if len(m.List()) != 0 || len(e.workRootNames()) != 0 {
		t.Errorf("left %d leases and %d dirs", len(m.List()), len(e.workRootNames()))
	}
}

func TestRunReapsUntilCanceled(t *testing.T) {
	expired := make(chan Event, 1)
	e := newEnv(t, func(c *Config) {
		c.OnEvent = func(ev Event) {
			if ev.Kind == EventExpired {
				expired <- ev
			}
		}
	})
	m := e.open()
	l := mustAcquire(t, m, Request{SessionID: "s", TTL: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { m.Run(ctx, time.Millisecond); close(stopped) }()

	e.clock.Advance(2 * time.Minute)
	select {
	case ev := <-expired:
		if ev.Lease.ID != l.ID {
			t.Errorf("expired %s, want %s", ev.Lease.ID, l.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not reap the expired lease within 10s")
	}
	cancel()
	<-stopped
	m.WaitRetired()
	assertGone(t, l.Dir)
	if _, err := m.Get(l.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after the reaper ran: %v, want ErrNotFound", err)
	}
}

func TestTouch(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	e.clock.Advance(time.Minute)
	m.Touch(l.ID)
	m.Touch("lunknownaaaaaaaaaaaaaaaaaaa") // ignored
	got, _ := m.Get(l.ID)
	if !got.LastActivityAt.Equal(e.clock.Now()) {
		t.Errorf("last activity %v, want %v", got.LastActivityAt, e.clock.Now())
	}
	if !got.ExpiresAt.Equal(l.ExpiresAt) {
		t.Error("Touch moved the expiry")
	}
}

func TestOrphans(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	orphan := newID()
	for _, d := range []string{filepath.Join(orphan, "work", "deep"), "not-a-lease", "lshort"} {
		if err := os.MkdirAll(filepath.Join(e.cfg.WorkRoot, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// An id-shaped file is not ours either way: we only ever make directories.
	if err := os.WriteFile(filepath.Join(e.cfg.WorkRoot, newID()), nil, 0o600); err != nil {
		t.Fatal(err)
	}

	removed, err := m.Orphans(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != orphan {
		t.Errorf("Orphans = %v, want [%s]", removed, orphan)
	}
	assertGone(t, filepath.Join(e.cfg.WorkRoot, orphan))
	assertMode(t, l.Workdir(), 0o700)
	assertMode(t, filepath.Join(e.cfg.WorkRoot, "not-a-lease"), 0o700)
	if n := len(e.workRootNames()); n != 4 {
		t.Errorf("%d entries left under WorkRoot, want 4", n)
	}
}

// Release returns once the lease's processes are gone and the journal says so; its
// directory goes after (a crash in between leaves an orphan for the startup sweep), and its
// uid is handed out again only then.
func TestReleaseRetiresInTheBackground(t *testing.T) {
	removing, proceed := make(chan struct{}), make(chan struct{})
	e := newEnv(t, func(c *Config) {
		c.UIDFirst, c.UIDLast = 200000, 200000
		c.RemoveDir = func(dir string) error {
			close(removing)
			<-proceed
			return os.RemoveAll(dir)
		}
	})
	m := e.open()
	ctx := context.Background()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	if err := m.Release(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	<-removing
	if _, torn := e.prov.counts(l.ID); torn != 1 {
		t.Errorf("Teardown called %d times before Release returned, want 1", torn)
	}
	if n := e.prov.retires(l.ID); n != 1 {
		t.Errorf("Retire called %d times before the directory's removal, want 1", n)
	}
	data, err := os.ReadFile(filepath.Join(e.cfg.StateDir, journalFileName))
	if err != nil {
		t.Fatal(err)
	}
	if leases, _, _, err := decodeJournal(data, e.cfg.WorkRoot); err != nil || len(leases) != 0 {
		t.Errorf("journal while the directory is removed: %v, %v; want no lease", leases, err)
	}
	if _, err := os.Lstat(l.Dir); err != nil {
		t.Errorf("the directory went before its removal ran: %v", err)
	}
	if !m.Owns(l.ID) {
		t.Error("the directory being removed is not owned: Orphans would race its removal")
	}

	type acquired struct {
		l   Lease
		err error
	}
	got := make(chan acquired)
	go func() { // waits for the only uid
		n, _, err := m.Acquire(ctx, Request{SessionID: "next"})
		got <- acquired{n, err}
	}()
	close(proceed)
	if n := <-got; n.err != nil || n.l.UID != l.UID {
		t.Errorf("next lease: uid %d, %v; want the freed %d", n.l.UID, n.err, l.UID)
	}
	assertGone(t, l.Dir)
}

// A lease whose remains cannot be retired keeps its directory and its uid, and both are
// tried again later; the lease itself is gone at once.
func TestReleaseRetireFailureIsRetried(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.UIDFirst, c.UIDLast = 200000, 200000 })
	m := e.open()
	ctx := context.Background()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	e.prov.setFailRetire(errors.New("devpts busy"))
	if err := m.Release(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	m.WaitRetired()
	if _, err := os.Lstat(l.Workdir()); err != nil {
		t.Fatalf("the workdir went before its lease's remains: %v", err)
	}
	if _, err := m.Get(l.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of the released lease: %v, want ErrNotFound", err)
	}
	if _, _, err := m.Acquire(ctx, Request{SessionID: "t"}); !errors.Is(err, ErrLimit) {
		t.Fatalf("acquire while the only uid's lease is not retired: %v, want ErrLimit", err)
	}

	e.prov.setFailRetire(nil)
	m.retryRetires()
	m.WaitRetired()
	assertGone(t, l.Dir)
	if n := e.prov.retires(l.ID); n != 1 {
		t.Errorf("Retire succeeded %d times, want 1", n)
	}
	if n := mustAcquire(t, m, Request{SessionID: "t"}); n.UID != l.UID {
		t.Errorf("uid %d after the retry, want the freed %d", n.UID, l.UID)
	}
}
