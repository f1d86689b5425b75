package testtool

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestFind(t *testing.T) {
	if p, ok := Find("sh"); !ok || !strings.HasSuffix(p, "/sh") {
		t.Errorf("Find(sh) = %q, %v", p, ok)
	}
	if p, ok := Find("no-such-tool-for-sidecar-tests"); ok {
		t.Errorf("Find found a tool that does not exist: %q", p)
	}
}

// A missing tool skips the test, naming the package; under SIDECAR_TEST_REQUIRE_ALL=1 it
// fails it. Run in a child go test so the outcome can be read from outside.
func TestNeedSkipsOrFails(t *testing.T) {
	if os.Getenv("TESTTOOL_CHILD") == "1" {
		Need(t, "no-such-tool-for-sidecar-tests", "no-such-package", "the child test")
		t.Log("reached after Need") // never: Need skips or fails
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		requireAll string
		wantErr    bool
		want       string
	}{
		{"", false, "--- SKIP"},
		{"1", true, "--- FAIL"},
	} {
		cmd := exec.Command(exe, "-test.run", "^TestNeedSkipsOrFails$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTTOOL_CHILD=1", RequireAllEnv+"="+c.requireAll)
		out, err := cmd.CombinedOutput()
		s := string(out)
		if (err != nil) != c.wantErr || !strings.Contains(s, c.want) ||
			!strings.Contains(s, "apt-get install no-such-package") || strings.Contains(s, "reached after Need") {
			t.Errorf("%s=%q: err %v, output:\n%s", RequireAllEnv, c.requireAll, err, s)
		}
	}
}

// A dynamic program's libraries include its loader (ld-linux*); a static one (busybox-static's,
// as in the VM tests) has none.
func TestLibraries(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	libs := Libraries(t, sh)
	if !slices.ContainsFunc(libs, func(l string) bool { return strings.HasPrefix(filepath.Base(l), "ld-linux") }) {
		t.Errorf("%s: libraries %q lack the loader", sh, libs)
	}
	busybox := Need(t, "busybox", "busybox-static", "it is a static program")
	if libs := Libraries(t, busybox); len(libs) != 0 {
		t.Errorf("static %s: libraries %q, want none", busybox, libs)
	}
}
