package lease

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
)

// fakeDisk records the Disk calls, and the directory removals, in the order they happen.
type fakeDisk struct {
	t          *testing.T
	mu         sync.Mutex
	ops        []string
	failDetach bool
}

func (d *fakeDisk) record(op string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ops = append(d.ops, op)
}

// Attach checks the directory exists and, the first time, is empty: a mount would hide
// what it holds. A restart attaches again on the lease's files.
func (d *fakeDisk) Attach(_ context.Context, dir string, bytes int64) error {
	entries, err := os.ReadDir(dir)
	again := slices.Contains(d.snapshot(), "attach "+filepath.Base(dir)+" "+strconv.FormatInt(bytes, 10))
	if err != nil || len(entries) > 0 && !again {
		d.t.Errorf("attach on %s: want an existing, empty directory (entries %d, err %v)", dir, len(entries), err)
	}
	d.record("attach " + filepath.Base(dir) + " " + strconv.FormatInt(bytes, 10))
	return nil
}

func (d *fakeDisk) Detach(_ context.Context, dir string) error {
	if d.failDetach {
		return errors.New("still mounted")
	}
	if _, err := os.Lstat(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.t.Error(err)
	}
	d.record("detach " + filepath.Base(dir))
	return nil
}

func (d *fakeDisk) Sweep(_ context.Context, owns func(string) bool) ([]string, error) {
	d.record("sweep")
	return nil, nil
}

func (d *fakeDisk) snapshot() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.ops)
}

func withDisk(d *fakeDisk) func(*Config) {
	return func(c *Config) {
		c.Disk = d
		c.DefaultLimits.DiskBytes = 1 << 20
		c.RemoveDir = func(dir string) error {
			d.record("remove " + filepath.Base(dir))
			return os.RemoveAll(dir)
		}
	}
}

// The filesystem is attached before anything is made in the directory, attached again
// (adopted) after a restart, and detached before the directory is removed on release.
func TestDiskAttachedFirstDetachedBeforeRemoval(t *testing.T) {
	d := &fakeDisk{t: t}
	e := newEnv(t, withDisk(d))
	m := e.open()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	if err := os.WriteFile(filepath.Join(l.Workdir(), "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m2 := e.open()
	if err := m2.Release(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	m2.WaitRetired()
	want := []string{"attach " + l.ID + " 1048576", "attach " + l.ID + " 1048576", "detach " + l.ID, "remove " + l.ID}
	if got := d.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	assertGone(t, l.Dir)
}

// A filesystem that cannot be detached keeps its directory (never removed through a
// mount) and its uid, and is tried again later; the lease itself is gone at once.
func TestDiskDetachFailureKeepsTheDirectory(t *testing.T) {
	d := &fakeDisk{t: t}
	e := newEnv(t, withDisk(d), func(c *Config) { c.UIDFirst, c.UIDLast = 200000, 200000 })
	m := e.open()
	ctx := context.Background()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	d.failDetach = true
	if err := m.Release(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	m.WaitRetired()
	if _, err := os.Lstat(l.Workdir()); err != nil {
		t.Fatalf("the workdir went: %v", err)
	}
	if slices.Contains(d.snapshot(), "remove "+l.ID) {
		t.Fatal("the directory was removed though its filesystem is still attached")
	}
	if _, err := m.Get(l.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of the released lease: %v, want ErrNotFound", err)
	}
	if _, _, err := m.Acquire(ctx, Request{SessionID: "t"}); !errors.Is(err, ErrLimit) {
		t.Fatalf("acquire while the only uid's directory remains: %v, want ErrLimit", err)
	}
	if removed, err := m.Orphans(ctx); err != nil || len(removed) != 0 {
		t.Fatalf("Orphans = %v, %v; want the directory left to its retry", removed, err)
	}
	if n := m.Retiring(); n != 1 {
		t.Errorf("Retiring = %d, want the lease whose directory remains", n)
	}

	d.failDetach = false
	m.retryRetires()
	m.WaitRetired()
	assertGone(t, l.Dir)
	if n := m.Retiring(); n != 0 {
		t.Errorf("Retiring = %d after the directory went, want 0", n)
	}
	if n := mustAcquire(t, m, Request{SessionID: "t"}); n.UID != l.UID {
		t.Errorf("uid %d after the retry, want the freed %d", n.UID, l.UID)
	}
}

// Orphan directories are detached before removal, and the disk's own sweep runs.
func TestDiskOrphansDetachedFirst(t *testing.T) {
	d := &fakeDisk{t: t}
	e := newEnv(t, withDisk(d))
	m := e.open()
	orphan := filepath.Join(e.cfg.WorkRoot, newID())
	if err := os.Mkdir(orphan, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Orphans(context.Background()); err != nil {
		t.Fatal(err)
	}
	id := filepath.Base(orphan)
	if got, want := d.snapshot(), []string{"detach " + id, "remove " + id, "sweep"}; !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
}
