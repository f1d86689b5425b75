package sandbox

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// testHelper is one helper binary the isolation tests run against.
type testHelper struct {
	name string
	path string
	skip string // why it cannot run here
	err  string // why it failed to build: every test using it fails
}

// testHelpers is set once by TestMain before any test runs and only read afterwards: the
// test binary itself (the Go helper, through InitMain) and the C sidecar-init.
var testHelpers []testHelper

const cHelperSource = "../../cmd/sidecar-init/sidecar-init.c"

// buildHelpers compiles the C helper as `make build` does and returns what removes it.
func buildHelpers() (cleanup func()) {
	self, err := os.Executable()
	if err != nil {
		panic(err)
	}
	testHelpers = []testHelper{{name: "go", path: self}}
	c := testHelper{name: "c"}
	// The VM tests (test/vm) boot without a compiler: they ship the helper built.
	if dir := os.Getenv("SIDECAR_TEST_PREBUILT"); dir != "" {
		c.path = filepath.Join(dir, "sidecar-init")
		if _, err := os.Stat(c.path); err != nil {
			c.err = err.Error()
		}
		testHelpers = append(testHelpers, c)
		return func() {}
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		c.skip = "cc is not installed (Debian: apt-get install gcc); it builds cmd/sidecar-init/sidecar-init.c"
		testHelpers = append(testHelpers, c)
		return func() {}
	}
	dir, err := os.MkdirTemp("", "sidecar-init-test-")
	if err != nil {
		panic(err)
	}
	c.path = filepath.Join(dir, "sidecar-init")
	out, err := exec.Command(cc, "-O2", "-static", "-Wall", "-Wextra", "-Werror", "-o", c.path, cHelperSource).CombinedOutput()
	switch {
	case err != nil && bytes.Contains(out, []byte("cannot find -lc")):
		c.skip = "no static libc (Debian: apt-get install libc6-dev); it links cmd/sidecar-init/sidecar-init.c"
	case err != nil:
		c.err = fmt.Sprintf("cc %s: %v\n%s", cHelperSource, err, out)
	}
	testHelpers = append(testHelpers, c)
	return func() { os.RemoveAll(dir) }
}

// usable is the path of helper h, or skips or fails t when h cannot run here.
func (h testHelper) usable(t testing.TB) string {
	t.Helper()
	if h.skip != "" {
		testtool.Missing(t, h.skip)
	}
	if h.err != "" {
		t.Fatal(h.err)
	}
	return h.path
}

// cHelperPath is the C helper's path, or skips or fails t when it cannot run here.
func cHelperPath(t testing.TB) string {
	t.Helper()
	for _, h := range testHelpers {
		if h.name == "c" {
			return h.usable(t)
		}
	}
	t.Fatal("no C helper among the test helpers")
	return ""
}

// forEachHelper runs test once per helper binary, each as a subtest with its own strict
// sandbox, so that every isolation property is checked against both; commands go to
// launchers where they can (package confine), and once more with the C helper, cold: every
// command started the plain way.
func forEachHelper(t *testing.T, test func(t *testing.T, s *Sandbox)) {
	for _, h := range testHelpers {
		t.Run(h.name, func(t *testing.T) {
			test(t, newTestSandboxWith(t, h.usable(t)))
		})
		if h.name == "c" {
			t.Run("c-cold", func(t *testing.T) {
				test(t, newTestSandboxConfig(t, Config{HelperPath: h.usable(t), ColdStart: true}))
			})
		}
	}
}
