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
// Go helper (the daemon's own binary, `sidecar __sandbox-init`, built as `make build`
// builds it: not this test binary, whose start-up under the race detector costs several
// times a command's) and the C sidecar-init.
var testHelpers []testHelper

const cHelperSource = "../../cmd/sidecar-init/sidecar-init.c"

// buildHelpers compiles both helpers as `make build` does and returns what removes them.
func buildHelpers() (cleanup func()) {
	// The VM tests (test/vm) boot without Go or a compiler: they ship the helpers built.
	if dir := os.Getenv("SIDECAR_TEST_PREBUILT"); dir != "" {
		for _, h := range []testHelper{{name: "go", path: filepath.Join(dir, "sidecar")}, {name: "c", path: filepath.Join(dir, "sidecar-init")}} {
			if _, err := os.Stat(h.path); err != nil {
				h.err = err.Error()
			}
			testHelpers = append(testHelpers, h)
		}
		return func() {}
	}
	dir, err := os.MkdirTemp("", "sidecar-helpers-test-")
	if err != nil {
		panic(err)
	}
	cleanup = func() { os.RemoveAll(dir) }
	g := testHelper{name: "go", path: filepath.Join(dir, "sidecar")}
	build := exec.Command("go", "build", "-trimpath", "-o", g.path, "./cmd/sidecar")
	build.Dir = "../.."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		g.err = fmt.Sprintf("go build ./cmd/sidecar: %v\n%s", err, out)
	}
	testHelpers = append(testHelpers, g)
	c := testHelper{name: "c"}
	cc, err := exec.LookPath("cc")
	if err != nil {
		c.skip = "cc is not installed (Debian: apt-get install gcc); it builds cmd/sidecar-init/sidecar-init.c"
		testHelpers = append(testHelpers, c)
		return cleanup
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
	return cleanup
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
func cHelperPath(t testing.TB) string { return testHelperPath(t, "c") }

// goHelperPath is the Go helper's path (the daemon's binary), or fails t when it did
// not build.
func goHelperPath(t testing.TB) string { return testHelperPath(t, "go") }

func testHelperPath(t testing.TB, name string) string {
	t.Helper()
	for _, h := range testHelpers {
		if h.name == name {
			return h.usable(t)
		}
	}
	t.Fatalf("no %s helper among the test helpers", name)
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
