package lease

import (
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"

	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// journalAfterTwo acquires a and b on a fresh env, without closing the Manager (a crash),
// and returns the journal's path, its bytes, and where b's record starts.
func journalAfterTwo(t *testing.T) (e *testEnv, path string, data []byte, bStart int, a, b Lease) {
	e = newEnv(t)
	m := e.open()
	path = filepath.Join(e.cfg.StateDir, journalFileName)
	a = mustAcquire(t, m, Request{SessionID: "a"})
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	b = mustAcquire(t, m, Request{SessionID: "b"})
	if data, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	return e, path, data, int(fi.Size()), a, b
}

func ids(ls []Lease) []string {
	out := []string{}
	for _, l := range ls {
		out = append(out, l.ID)
	}
	slices.Sort(out)
	return out
}

func TestJournalTornTailIsDropped(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(data []byte, bStart int) []byte
		keepB  bool
	}{
		{"header cut short", func(d []byte, b int) []byte { return d[:b+3] }, false},
		{"payload cut short", func(d []byte, b int) []byte { return d[:len(d)-10] }, false},
		{"last record fails its checksum", func(d []byte, b int) []byte {
			d = slices.Clone(d)
			d[len(d)-5] ^= 0x20
			return d
		}, false},
		{"last record zeroed", func(d []byte, b int) []byte {
			d = slices.Clone(d)
			clear(d[b:])
			return d
		}, false},
		{"zeros after the last record", func(d []byte, b int) []byte { return append(slices.Clone(d), make([]byte, 4096)...) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, path, data, bStart, a, b := journalAfterTwo(t)
			damaged := tc.damage(data, bStart)
			if err := os.WriteFile(path, damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			m := e.open()
			want := []string{a.ID}
			if tc.keepB {
				want = append(want, b.ID)
			}
			slices.Sort(want)
			if got := ids(m.List()); !slices.Equal(got, want) {
				t.Fatalf("leases after a torn tail: %v, want %v", got, want)
			}
			if !strings.Contains(e.logs.String(), "torn") {
				t.Errorf("the dropped record was not logged:\n%s", e.logs.String())
			}
			wantSize := int64(bStart)
			if tc.keepB {
				wantSize = int64(len(data))
			}
			if fi, err := os.Stat(path); err != nil || fi.Size() != wantSize {
				t.Fatalf("journal not cut back to its good part: %v, %v bytes, want %d", err, fi.Size(), wantSize)
			}
			// Appends go after the good part, and a restart reads them.
			c := mustAcquire(t, m, Request{SessionID: "c"})
			m2 := e.open()
			if got, want := ids(m2.List()), ids(append(m.List()[:0:0], m.List()...)); !slices.Equal(got, want) || !slices.Contains(got, c.ID) {
				t.Fatalf("after an append and a restart: %v, want %v with %s", got, want, c.ID)
			}
		})
	}
}

func TestJournalCorruptionIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(data []byte, bStart int) []byte
	}{
		{"bad header", func(d []byte, b int) []byte {
			d = slices.Clone(d)
			d[3] = 'X'
			return d
		}},
		{"first record damaged, another follows", func(d []byte, b int) []byte {
			d = slices.Clone(d)
			d[len(journalMagic)+20] ^= 0x01
			return d
		}},
		{"first record's length damaged", func(d []byte, b int) []byte {
			d = slices.Clone(d)
			d[len(journalMagic)+3]++
			return d
		}},
		{"garbage, then a good record", func(d []byte, b int) []byte {
			return append(append(slices.Clone(d), "garbage"...), d[b:]...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, path, data, bStart, _, _ := journalAfterTwo(t)
			damaged := tc.damage(data, bStart)
			if err := os.WriteFile(path, damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(context.Background(), e.cfg)
			if !errors.Is(err, ErrCorruptState) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Open = %v, want ErrCorruptState naming %s", err, path)
			}
			copies, _ := filepath.Glob(path + ".corrupt-*")
			if len(copies) != 1 {
				t.Fatalf("copies aside: %v, want one", copies)
			}
			if c, _ := os.ReadFile(copies[0]); string(c) != string(damaged) {
				t.Error("the copy aside is not the corrupt journal")
			}
			if now, _ := os.ReadFile(path); string(now) != string(damaged) {
				t.Error("the refused journal was changed")
			}
		})
	}
}

// A record that reads back whole but holds a lease no daemon would write is refused too.
func TestJournalBadLeaseIsRefused(t *testing.T) {
	e, path, _, _, _, _ := journalAfterTwo(t)
	bad := storedLease{ID: "../../etc", SessionID: "s", Network: netpolicy.Policy{Egress: netpolicy.EgressInternet}, CreatedAt: time.Now(), ExpiresAt: time.Now()}
	fi, _ := os.Stat(path)
	j := &journal{path: path, size: fi.Size()}
	if err := j.appendRecords(journalRecord{Put: &bad}); err != nil {
		t.Fatal(err)
	}
	j.close()
	if _, err := Open(context.Background(), e.cfg); !errors.Is(err, ErrCorruptState) {
		t.Fatalf("Open = %v, want ErrCorruptState", err)
	}
}

// A state dir of the previous version (leases.json) is read and upgraded in place.
func TestUpgradeFromLeasesJSON(t *testing.T) {
	e := newEnv(t)
	if err := os.MkdirAll(e.cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	now := e.clock.Now()
	old := []Lease{
		{ID: newID(), SessionID: "one", Network: netpolicy.Policy{Egress: netpolicy.EgressInternet}, CreatedAt: now, ExpiresAt: now.Add(time.Hour), LastActivityAt: now, Labels: map[string]string{"k": "v"}},
		{ID: newID(), SessionID: "two", Network: netpolicy.Policy{Egress: netpolicy.EgressNone}, CreatedAt: now.Add(time.Second), ExpiresAt: now.Add(time.Hour), LastActivityAt: now},
	}
	if err := saveState(e.cfg.StateDir, old); err != nil {
		t.Fatal(err)
	}
	m := e.open()
	if got := ids(m.List()); !slices.Equal(got, ids(old)) {
		t.Fatalf("leases after the upgrade: %v, want %v", got, ids(old))
	}
	if l, err := m.Get(old[0].ID); err != nil || l.Labels["k"] != "v" || !l.ExpiresAt.Equal(old[0].ExpiresAt) {
		t.Errorf("upgraded lease %+v, %v", l, err)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, stateFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leases.json still there after the upgrade: %v", err)
	}
	if des, _ := os.ReadDir(e.cfg.StateDir); len(des) != 1 || des[0].Name() != journalFileName {
		t.Errorf("state dir after the upgrade: %v, want only %s", des, journalFileName)
	}
	third := mustAcquire(t, m, Request{SessionID: "three"})
	if err := m.Release(context.Background(), old[1].ID); err != nil {
		t.Fatal(err)
	}
	m2 := e.open()
	if got, want := ids(m2.List()), ids([]Lease{old[0], third}); !slices.Equal(got, want) {
		t.Fatalf("after the upgrade and a restart: %v, want %v", got, want)
	}
}

// An upgrade that crashed after writing the journal but before removing leases.json:
// the journal is the newer state and wins; leases.json goes.
func TestUpgradeInterruptedJournalWins(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	kept := mustAcquire(t, m, Request{SessionID: "kept"})
	now := e.clock.Now()
	stale := Lease{ID: newID(), SessionID: "stale", Network: netpolicy.Policy{Egress: netpolicy.EgressInternet}, CreatedAt: now, ExpiresAt: now.Add(time.Hour), LastActivityAt: now}
	if err := saveState(e.cfg.StateDir, []Lease{stale}); err != nil {
		t.Fatal(err)
	}
	m2 := e.open()
	if got := ids(m2.List()); !slices.Equal(got, []string{kept.ID}) {
		t.Fatalf("leases: %v, want the journal's %s", got, kept.ID)
	}
	if _, err := os.Stat(filepath.Join(e.cfg.StateDir, stateFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leases.json left behind: %v", err)
	}
}

// Run's flush and Close compact the journal to one record per lease; the table survives.
func TestJournalCompacts(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	ctx := context.Background()
	keep := mustAcquire(t, m, Request{SessionID: "keep"})
	for i := range 40 {
		l := mustAcquire(t, m, Request{SessionID: "churn-" + string(rune('a'+i%26)) + string(rune('a'+i/26))})
		if err := m.Release(ctx, l.ID); err != nil {
			t.Fatal(err)
		}
	}
	if m.journal.records < 80 {
		t.Fatalf("journal holds %d records after 81 changes: not appending?", m.journal.records)
	}
	if err := m.flush(); err != nil {
		t.Fatal(err)
	}
	if m.journal.records != 1 {
		t.Fatalf("journal holds %d records after compaction, want 1", m.journal.records)
	}
	e.clock.Advance(time.Second)
	m.Touch(keep.ID)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m2 := e.open()
	l, err := m2.Get(keep.ID)
	if err != nil || !l.LastActivityAt.Equal(e.clock.Now()) {
		t.Fatalf("after compaction and a restart: %+v, %v (activity want %v)", l, err, e.clock.Now())
	}
	if n := len(m2.List()); n != 1 {
		t.Errorf("%d leases after a restart, want 1", n)
	}
}
