package lease

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Two daemons on one host never hand out the same uids: the second whose range overlaps
// a running one's is refused, told whose; apart, or once the first is gone, it starts.
func TestUIDRangesOfTwoDaemons(t *testing.T) {
	owners := filepath.Join(t.TempDir(), "owners")
	open := func(first, last int) (*Manager, error) {
		root := t.TempDir()
		return Open(context.Background(), Config{StateDir: filepath.Join(root, "state"), WorkRoot: filepath.Join(root, "work"),
			UIDFirst: first, UIDLast: last, UIDOwners: owners, RemoveDir: os.RemoveAll})
	}
	a, err := open(500000, 500999)
	if err != nil {
		t.Fatal(err)
	}
	_, err = open(500900, 501900)
	if !errors.Is(err, ErrUIDRangeOwned) || !strings.Contains(err.Error(), "500000-500999") || !strings.Contains(err.Error(), "SIDECAR_UID_RANGE") {
		t.Fatalf("an overlapping range: %v", err)
	}
	b, err := open(501000, 501999)
	if err != nil {
		t.Fatalf("a range apart: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	c, err := open(500900, 500999)
	if err != nil {
		t.Fatalf("the range of a daemon that stopped: %v", err)
	}
	c.Close()
	b.Close()
	if names, _ := filepath.Glob(filepath.Join(owners, "*.json")); len(names) != 0 {
		t.Errorf("records left after every daemon stopped: %v", names)
	}
}

func TestSameStateDirTwice(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.UIDFirst, c.UIDLast = 600000, 600009 })
	e.open()
	if _, err := Open(context.Background(), e.cfg); !errors.Is(err, ErrUIDRangeOwned) {
		t.Fatalf("a second daemon on the same state dir: %v", err)
	}
}

// A state dir's derived range is one block, the same every time, recorded; one that holds
// leases from before keeps the range every daemon had then.
func TestDefaultUIDRange(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	first, last, err := DefaultUIDRange(dir)
	if err != nil {
		t.Fatal(err)
	}
	if last-first+1 != uidBlock || first < uidBase || (first-uidBase)%uidBlock != 0 || last > 1<<31-2 {
		t.Fatalf("derived %d-%d", first, last)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, uidRangeFile)); strings.TrimSpace(string(b)) == "" {
		t.Error("the range is not recorded")
	}
	if f2, l2, _ := DefaultUIDRange(dir); f2 != first || l2 != last {
		t.Errorf("read back %d-%d, first %d-%d", f2, l2, first, last)
	}
	old := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(old, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, stateFileName), []byte(`{"version":1,"leases":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if f, l, err := DefaultUIDRange(old); err != nil || f != 200000 || l != 265535 {
		t.Errorf("a state dir from before: %d-%d %v", f, l, err)
	}
	bad := filepath.Join(t.TempDir(), "state")
	_ = os.MkdirAll(bad, 0o700)
	_ = os.WriteFile(filepath.Join(bad, uidRangeFile), []byte("many"), 0o600)
	if _, _, err := DefaultUIDRange(bad); err == nil || !strings.Contains(err.Error(), "SIDECAR_UID_RANGE") {
		t.Errorf("a malformed record: %v", err)
	}
}
