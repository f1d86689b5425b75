package lease

import (
	"context"
	"errors"
	"fmt"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock shared by a Manager and its Tokens.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// fakeProvisioner records calls and fails on demand. Provision checks that the lease's
// directories exist, as a real one (chown of work/ and tmp/) needs them.
type fakeProvisioner struct {
	mu            sync.Mutex
	provisioned   map[string]int
	tornDown      map[string]int
	retired       map[string]int
	failProvision error
	failTeardown  error
	failRetire    error
	gate          chan struct{} // when set, Provision waits for it to close
	entered       chan string   // when set, Provision sends the lease id on entry
}

func newProvisioner() *fakeProvisioner {
	return &fakeProvisioner{provisioned: map[string]int{}, tornDown: map[string]int{}, retired: map[string]int{}}
}

func (p *fakeProvisioner) Provision(ctx context.Context, l Lease) error {
	if p.entered != nil {
		p.entered <- l.ID
	}
	if p.gate != nil {
		select {
		case <-p.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, d := range []string{l.Workdir(), l.TmpDir(), l.UploadsDir()} {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			return errors.New("provision: missing directory " + d)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failProvision != nil {
		return p.failProvision
	}
	p.provisioned[l.ID]++
	return nil
}

func (p *fakeProvisioner) Teardown(_ context.Context, l Lease) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failTeardown != nil {
		return p.failTeardown
	}
	p.tornDown[l.ID]++
	return nil
}

// Retire fails while failRetire is set, or when the lease's directory is gone already: it
// must run before that removal.
func (p *fakeProvisioner) Retire(_ context.Context, l Lease) error {
	if _, err := os.Lstat(l.Dir); err != nil {
		return fmt.Errorf("retire after the directory went: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failRetire != nil {
		return p.failRetire
	}
	p.retired[l.ID]++
	return nil
}

func (p *fakeProvisioner) retires(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.retired[id]
}

func (p *fakeProvisioner) setFailRetire(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failRetire = err
}

func (p *fakeProvisioner) counts(id string) (provisioned, tornDown int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.provisioned[id], p.tornDown[id]
}

func (p *fakeProvisioner) setFail(provision, teardown error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failProvision, p.failTeardown = provision, teardown
}

// testEnv is one daemon's worth of lease state in temp dirs.
type testEnv struct {
	t      *testing.T
	clock  *fakeClock
	prov   *fakeProvisioner
	logs   *testtool.Buffer
	cfg    Config
	mu     sync.Mutex
	events []Event
}

func newEnv(t *testing.T, configure ...func(*Config)) *testEnv {
	t.Helper()
	root := t.TempDir()
	e := &testEnv{t: t, clock: newClock(), prov: newProvisioner(), logs: &testtool.Buffer{}}
	e.cfg = Config{
		StateDir:    filepath.Join(root, "state"),
		WorkRoot:    filepath.Join(root, "work"),
		Provisioner: e.prov,
		Now:         e.clock.Now,
		Logger:      slog.New(slog.NewTextHandler(e.logs, nil)),
		OnEvent: func(ev Event) {
			e.mu.Lock()
			defer e.mu.Unlock()
			e.events = append(e.events, ev)
		},
		RemoveDir: os.RemoveAll, // fsxfer.RemoveTree is tested in TestReleaseWithRemoveTree
		UIDOwners: filepath.Join(root, "uid-owners"),
	}
	for _, f := range configure {
		f(&e.cfg)
	}
	return e
}

// open opens a Manager on the env's dirs and closes it when the test ends.
func (e *testEnv) open() *Manager {
	e.t.Helper()
	m, err := Open(context.Background(), e.cfg)
	if err != nil {
		e.t.Fatalf("Open: %v", err)
	}
	e.t.Cleanup(func() {
		if err := m.Close(); err != nil {
			e.t.Errorf("Close: %v", err)
		}
	})
	return m
}

func (e *testEnv) eventKinds(id string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var kinds []string
	for _, ev := range e.events {
		if ev.Lease.ID == id {
			kinds = append(kinds, ev.Kind)
		}
	}
	return kinds
}

func mustAcquire(t *testing.T, m *Manager, r Request) Lease {
	t.Helper()
	l, created, err := m.Acquire(context.Background(), r)
	if err != nil {
		t.Fatalf("Acquire(%q): %v", r.SessionID, err)
	}
	if !created {
		t.Fatalf("Acquire(%q): created = false, want a new lease", r.SessionID)
	}
	return l
}

// workRootNames lists what is under WorkRoot.
func (e *testEnv) workRootNames() []string {
	e.t.Helper()
	des, err := os.ReadDir(e.cfg.WorkRoot)
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func assertMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != want {
		t.Errorf("%s: mode %v, want directory %v", path, fi.Mode(), want)
	}
}

func assertGone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists (err %v)", path, err)
	}
}

// WaitRetired waits for the directories of the leases released so far to be removed (or
// their removal to fail).
func (m *Manager) WaitRetired() { _ = m.waitRetired(context.Background()) }
