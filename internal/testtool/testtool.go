// Package testtool is how a test that needs a program or library from the host says so.
//
// `make test` must pass on a machine with only Go and make, so a test whose tool is
// missing skips, naming the tool and the Debian package that provides it. CI installs
// every such package and sets SIDECAR_TEST_REQUIRE_ALL=1, under which a missing tool
// fails the test instead: a skip there would let a test stop running unnoticed.
package testtool

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// RequireAllEnv names the variable under which a missing tool fails the test.
const RequireAllEnv = "SIDECAR_TEST_REQUIRE_ALL"

// sbin holds the directories searched after PATH: a non-login root shell may lack them,
// and Debian keeps mkfs.ext4 and ip there.
var sbin = []string{"/usr/sbin", "/sbin"}

// Need returns the path of the program name, found in PATH or an sbin directory. Without
// it the test skips (fails under SIDECAR_TEST_REQUIRE_ALL=1) with a message naming the
// Debian package pkg and why the test needs it.
func Need(t testing.TB, name, pkg, why string) string {
	t.Helper()
	if p, ok := Find(name); ok {
		return p
	}
	Missing(t, name+" is not installed (Debian: apt-get install "+pkg+"); "+why)
	return ""
}

// Find reports where the program name is, in PATH or an sbin directory.
func Find(name string) (string, bool) {
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	for _, d := range sbin {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// Missing skips t with reason, or fails it under SIDECAR_TEST_REQUIRE_ALL=1.
func Missing(t testing.TB, reason string) {
	t.Helper()
	if RequireAll() {
		t.Fatalf("%s (%s=1: every tool a test needs must be installed)", reason, RequireAllEnv)
	}
	t.Skipf("%s; CI installs it and runs this test (%s=1)", reason, RequireAllEnv)
}

// RequireAll reports whether a missing tool fails the test (SIDECAR_TEST_REQUIRE_ALL=1).
func RequireAll() bool { return os.Getenv(RequireAllEnv) == "1" }
