package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A directory of Config.LeasePath (SIDECAR_LEASE_PATH) follows DefaultPath in a lease's
// PATH, and a lease runs a tool from it by its bare name.
func TestLeasePathExtendsPath(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: strict isolation")
	}
	// Under /usr/local: a directory lease processes may run programs from.
	dir, err := os.MkdirTemp("/usr/local", "sidecar-test-path-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tool := filepath.Join(dir, "sidecar-test-tool")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\necho tool ran as $(id -u)\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	s := newTestSandboxConfig(t, Config{HelperPath: goHelperPath(t), LeasePath: []string{dir}})
	l := newTestLease(t, s, nil)

	r := run(t, s, l.ID, sh(`echo "$PATH"`))
	if got, want := strings.TrimSpace(r.stdout), DefaultPath+":"+dir; got != want {
		t.Fatalf("lease PATH %q, want %q", got, want)
	}
	r = run(t, s, l.ID, Spec{Argv: []string{"sidecar-test-tool"}})
	if got, want := strings.TrimSpace(r.stdout), "tool ran as "+strconv.Itoa(l.UID); got != want {
		t.Fatalf("tool from the lease PATH: %q (stderr %q), want %q", got, r.stderr, want)
	}
}

// What SIDECAR_LEASE_PATH accepts: clean absolute directories under the system
// directories, no empty entry; New also wants each to be a directory.
func TestLeasePathValidation(t *testing.T) {
	for _, bad := range []string{"usr/bin", "/usr/local/go/bin:", ":/usr/local/go/bin", "/usr/a::/usr/b",
		"/usr/local/../../home/x", "/usr/local/go/bin/", "/home/agent/bin", "/tmp/tools"} {
		if _, err := LeasePathDirs(bad); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "SIDECAR_LEASE_PATH") {
			t.Errorf("%q: %v, want ErrInvalid naming SIDECAR_LEASE_PATH", bad, err)
		}
	}
	if dirs, err := LeasePathDirs("/usr/local/go/bin:/opt/tools/bin"); err != nil || len(dirs) != 2 {
		t.Errorf("two good entries: %q %v", dirs, err)
	}
	if dirs, err := LeasePathDirs(""); err != nil || dirs != nil {
		t.Errorf("empty: %q %v", dirs, err)
	}
	if _, err := leasePath([]string{"/usr/sidecar-no-such-dir"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a missing directory: %v", err)
	}
	if p, err := leasePath(nil); p != DefaultPath || err != nil {
		t.Errorf("no lease path: %q %v", p, err)
	}
}
