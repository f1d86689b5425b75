package lease

import (
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"

	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStateFileIsVersionedAndPrivate(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	l := mustAcquire(t, m, Request{SessionID: "s", Labels: map[string]string{"k": "v"}})

	path := filepath.Join(e.cfg.StateDir, journalFileName)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %v, want 0600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(data), journalMagic) {
		t.Errorf("state file does not start with its versioned header: %q", data)
	}
	leases, _, _, err := decodeJournal(data, e.cfg.WorkRoot)
	if err != nil || len(leases) != 1 || leases[0].ID != l.ID || leases[0].Labels["k"] != "v" {
		t.Errorf("state file = %q: %v, %v", data, leases, err)
	}
	if strings.Contains(string(data), e.cfg.WorkRoot) {
		t.Error("state file stores directories; they must be derived from WorkRoot and the id")
	}
	des, _ := os.ReadDir(e.cfg.StateDir)
	if len(des) != 1 {
		t.Errorf("state dir holds %d entries, want only %s (no temp files left)", len(des), journalFileName)
	}

	if err := m.Release(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(path)
	if leases, _, _, err := decodeJournal(data, e.cfg.WorkRoot); err != nil || len(leases) != 0 {
		t.Errorf("after release the state file holds %v (%v)", leases, err)
	}
}

func TestRestartKeepsLeasesAndTokens(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.UIDFirst, c.UIDLast = 400000, 400009 })
	secret := []byte("0123456789abcdef0123456789abcdef")
	m := e.open()
	kept := mustAcquire(t, m, Request{SessionID: "kept", TTL: time.Hour, Labels: map[string]string{"a": "b"}, Network: netpolicy.Policy{Egress: netpolicy.EgressNone}})
	short := mustAcquire(t, m, Request{SessionID: "short", TTL: time.Minute})
	tokens, err := NewTokens(e.cfg.StateDir, secret)
	if err != nil {
		t.Fatal(err)
	}
	token, err := tokens.WithClock(e.clock.Now).Issue(kept)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(30 * time.Second)
	m.Touch(kept.ID)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	// The daemon is down while short expires.
	e.clock.Advance(time.Minute)
	e.prov = newProvisioner()
	e.cfg.Provisioner = e.prov
	m2 := e.open()

	got, err := m2.Get(kept.ID)
	if err != nil {
		t.Fatalf("kept lease after restart: %v", err)
	}
	want := kept
	want.LastActivityAt = kept.CreatedAt.Add(30 * time.Second)
	if got.ID != want.ID || got.SessionID != want.SessionID || got.Dir != want.Dir || got.UID != want.UID ||
		got.Network.Egress != want.Network.Egress || got.Labels["a"] != "b" || got.Limits != want.Limits ||
		!got.CreatedAt.Equal(want.CreatedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) || !got.LastActivityAt.Equal(want.LastActivityAt) {
		t.Errorf("after restart:\n got %+v\nwant %+v", got, want)
	}
	if p, _ := e.prov.counts(kept.ID); p != 1 {
		t.Errorf("active lease provisioned %d times on restart, want 1", p)
	}
	if p, _ := e.prov.counts(short.ID); p != 0 {
		t.Errorf("lease that expired while down was provisioned again")
	}
	if again, created, err := m2.Acquire(context.Background(), Request{SessionID: "kept"}); err != nil || created || again.ID != kept.ID {
		t.Errorf("re-acquire after restart: %s %v %v, want the same lease", again.ID, created, err)
	}

	tokens2, err := NewTokens(e.cfg.StateDir, secret)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := tokens2.WithClock(e.clock.Now).Verify(token); err != nil || id != kept.ID {
		t.Errorf("token after restart: %q, %v", id, err)
	}

	// The first Reap releases what expired while the daemon was down.
	reaped, err := m2.Reap(context.Background())
	if err != nil || len(reaped) != 1 || reaped[0].ID != short.ID {
		t.Errorf("first Reap after restart = %v, %v; want the short lease", reaped, err)
	}
	m2.WaitRetired()
	assertGone(t, short.Dir)
	// Uids of restored leases stay taken.
	if n := mustAcquire(t, m2, Request{SessionID: "new"}); n.UID == kept.UID {
		t.Errorf("new lease got uid %d of a restored lease", n.UID)
	}
}

func TestRestartRecreatesMissingDirs(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(l.TmpDir()); err != nil {
		t.Fatal(err)
	}
	e.open()
	assertMode(t, l.TmpDir(), 0o700)
}

func TestRestartExpiresLeaseThatCannotBeProvisioned(t *testing.T) {
	e := newEnv(t)
	m := e.open()
	l := mustAcquire(t, m, Request{SessionID: "s"})
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	e.prov.setFail(errors.New("no cgroup"), nil)
	m2 := e.open()
	if _, err := m2.Get(l.ID); !errors.Is(err, ErrExpired) {
		t.Fatalf("Get = %v, want ErrExpired for a lease that could not be restored", err)
	}
	if reaped, err := m2.Reap(context.Background()); err != nil || len(reaped) != 1 {
		t.Errorf("Reap = %v, %v", reaped, err)
	}
	m2.WaitRetired()
	assertGone(t, l.Dir)
}

func TestCorruptStateFileIsRefused(t *testing.T) {
	valid := func(id string) string {
		return `{"version":1,"leases":[{"id":"` + id + `","session_id":"s","network":"host","limits":{},` +
			`"created_at":"2026-01-01T00:00:00Z","expires_at":"2026-01-01T01:00:00Z","last_activity_at":"2026-01-01T00:00:00Z"}]}`
	}
	for _, tc := range []struct{ name, content string }{
		{"garbage", "{not json"},
		{"truncated", valid(newID())[:40]},
		{"future version", `{"version":2,"leases":[]}`},
		{"path in id", valid("../../etc")},
		{"duplicate id", strings.Replace(valid("laaaaaaaaaaaaaaaaaaaaaaaaaa"), `}]}`, `},`+valid("laaaaaaaaaaaaaaaaaaaaaaaaaa")[28:], 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if err := os.MkdirAll(e.cfg.StateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(e.cfg.StateDir, stateFileName)
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
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
			if data, _ := os.ReadFile(copies[0]); string(data) != tc.content {
				t.Errorf("copy aside holds %q, want the original", data)
			}
			if data, _ := os.ReadFile(path); string(data) != tc.content {
				t.Errorf("the corrupt file was changed")
			}
		})
	}
}

func TestValidStateFileLoads(t *testing.T) {
	// Guards the corrupt-file cases above: the same shape, well formed, loads.
	e := newEnv(t)
	if err := os.MkdirAll(e.cfg.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	content := `{"version":1,"leases":[{"id":"laaaaaaaaaaaaaaaaaaaaaaaaaa","session_id":"s","network":"host","limits":{},` +
		`"created_at":"2026-01-01T00:00:00Z","expires_at":"2026-01-01T01:00:00Z","last_activity_at":"2026-01-01T00:00:00Z"}]}`
	if err := os.WriteFile(filepath.Join(e.cfg.StateDir, stateFileName), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	m := e.open()
	if ls := m.List(); len(ls) != 1 || ls[0].Dir != filepath.Join(e.cfg.WorkRoot, "laaaaaaaaaaaaaaaaaaaaaaaaaa") {
		t.Errorf("List = %+v", ls)
	}
}
