package certgen

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func readFile(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func mode(t *testing.T, name string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func TestEnsureSelfSignedIsIdempotent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state") // created on demand
	hosts := []string{"localhost", "127.0.0.1"}

	certFile, keyFile, created, err := EnsureSelfSigned(dir, hosts)
	if err != nil || !created {
		t.Fatalf("first call: created=%v err=%v", created, err)
	}
	if m := mode(t, keyFile); m != 0o600 {
		t.Errorf("key mode %o, want 600", m)
	}
	if m := mode(t, certFile); m != 0o644 {
		t.Errorf("cert mode %o, want 644", m)
	}
	if m := mode(t, dir); m != 0o700 {
		t.Errorf("dir mode %o, want 700", m)
	}
	cert1 := readFile(t, certFile)

	// Same hosts, in another order and case: reused, byte for byte.
	_, _, created, err = EnsureSelfSigned(dir, []string{"127.0.0.1", "LOCALHOST"})
	if err != nil || created {
		t.Fatalf("second call: created=%v err=%v", created, err)
	}
	if !bytes.Equal(cert1, readFile(t, certFile)) {
		t.Error("certificate changed although it was reusable")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("dir holds %d entries, want 2 (no temp files left)", len(entries))
	}

	// A key loosened by hand is tightened, not replaced.
	if err := os.Chmod(keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, created, err = EnsureSelfSigned(dir, hosts); err != nil || created {
		t.Fatalf("loose key: created=%v err=%v", created, err)
	}
	if m := mode(t, keyFile); m != 0o600 {
		t.Errorf("key mode after reuse %o, want 600", m)
	}
}

func TestEnsureSelfSignedRegenerates(t *testing.T) {
	hosts := []string{"localhost"}
	for _, tc := range []struct {
		name  string
		spoil func(t *testing.T, certFile, keyFile string)
		hosts []string
	}{
		{name: "new host", hosts: []string{"localhost", "sandbox.internal"}},
		{name: "expiring", spoil: func(t *testing.T, certFile, keyFile string) {
			certPEM, keyPEM, err := SelfSigned(hosts, RenewBefore-time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(certFile, certPEM, 0o644)
			os.WriteFile(keyFile, keyPEM, 0o600)
		}},
		{name: "torn pair", spoil: func(t *testing.T, certFile, keyFile string) {
			_, keyPEM, err := SelfSigned(hosts, 0)
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(keyFile, keyPEM, 0o600)
		}},
		{name: "garbage", spoil: func(t *testing.T, certFile, keyFile string) {
			os.WriteFile(certFile, []byte("garbage"), 0o644)
		}},
		{name: "key missing", spoil: func(t *testing.T, certFile, keyFile string) {
			os.Remove(keyFile)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			certFile, keyFile, _, err := EnsureSelfSigned(dir, hosts)
			if err != nil {
				t.Fatal(err)
			}
			if tc.spoil != nil {
				tc.spoil(t, certFile, keyFile)
			}
			want := hosts
			if tc.hosts != nil {
				want = tc.hosts
			}
			_, _, created, err := EnsureSelfSigned(dir, want)
			if err != nil || !created {
				t.Fatalf("created=%v err=%v, want a new pair", created, err)
			}
			if !reusable(certFile, keyFile, want, time.Now()) {
				t.Error("the new pair is not reusable")
			}
		})
	}
}

func TestEnsureSelfSignedRejectsBadHosts(t *testing.T) {
	dir := t.TempDir()
	if _, _, _, err := EnsureSelfSigned(dir, nil); err == nil {
		t.Fatal("no hosts accepted")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("bad input left %d files behind", len(entries))
	}
}
