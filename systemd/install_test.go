package systemd

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// installLayout is the documented layout of `make install` (docs/operations.md), with
// each file's mode.
var installLayout = map[string]fs.FileMode{
	"usr/local/bin/sidecar":                     0o755,
	"usr/local/bin/sidecar-init":                0o755,
	"etc/systemd/system/sidecar.service":        0o644,
	"usr/local/share/doc/sidecar/operations.md": 0o644,
	"usr/local/share/doc/sidecar/api.md":        0o644,
	"workspace":                                 fs.ModeDir | 0o755,
	"etc/sidecar":                               fs.ModeDir | 0o700,
	"etc/sidecar/sidecar.env":                   0o600,
	"etc/sidecar/auth-token":                    0o600,
	"etc/sidecar/tls":                           fs.ModeDir | 0o700,
	"etc/sidecar/tls/ca.crt":                    0o644,
	"etc/sidecar/tls/ca.key":                    0o600,
	"etc/sidecar/tls/server.crt":                0o644,
	"etc/sidecar/tls/server.key":                0o600,
}

func TestMakeInstallLayout(t *testing.T) {
	testtool.Need(t, "make", "make", "it runs make install")
	root := t.TempDir()
	install := func() {
		t.Helper()
		cmd := exec.Command("make", "-C", "..", "install", "DESTDIR="+root, "TLS_HOST=sandbox.test", "TLS_IP=192.0.2.7")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make install: %v\n%s", err, out)
		}
	}
	install()
	got := map[string]fs.FileMode{}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if _, listed := installLayout[rel]; !listed {
				return nil // intermediate directories (usr, usr/local, …)
			}
			got[rel] = fs.ModeDir | info.Mode().Perm()
			return nil
		}
		got[rel] = info.Mode().Perm()
		return nil
	})
	var problems []string
	for name, want := range installLayout {
		if g, ok := got[name]; !ok {
			problems = append(problems, "missing "+name)
		} else if g != want {
			problems = append(problems, name+": mode "+g.String()+", want "+want.String())
		}
	}
	for name := range got {
		if _, ok := installLayout[name]; !ok {
			problems = append(problems, "undocumented "+name)
		}
	}
	sort.Strings(problems)
	if len(problems) > 0 {
		t.Fatal(strings.Join(problems, "\n"))
	}
	token, _ := os.ReadFile(filepath.Join(root, "etc/sidecar/auth-token"))
	if len(strings.TrimSpace(string(token))) < 32 {
		t.Fatalf("generated token too short: %d", len(token))
	}
	// Idempotent: a second install keeps the secrets it made.
	cert, _ := os.ReadFile(filepath.Join(root, "etc/sidecar/tls/server.crt"))
	install()
	token2, _ := os.ReadFile(filepath.Join(root, "etc/sidecar/auth-token"))
	cert2, _ := os.ReadFile(filepath.Join(root, "etc/sidecar/tls/server.crt"))
	if string(token) != string(token2) || string(cert) != string(cert2) {
		t.Fatal("a second make install replaced the token or the certificate")
	}
	cmd := exec.Command("make", "-C", "..", "uninstall", "DESTDIR="+root)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make uninstall: %v\n%s", err, out)
	}
	for _, gone := range []string{"usr/local/bin/sidecar", "etc/systemd/system/sidecar.service", "workspace"} {
		if _, err := os.Stat(filepath.Join(root, gone)); err == nil {
			t.Errorf("uninstall left %s", gone)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "etc/sidecar/auth-token")); err != nil {
		t.Errorf("uninstall removed the token: %v", err)
	}
}
