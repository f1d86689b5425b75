package confine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

// A cell is a cgroup beside the leases' under the parent, made by the same driver: its
// child holds a process under a memory limit the kernel enforces (the OOM kill is
// counted), a new cell of the same name clears what an earlier run left, and Remove
// leaves nothing.
func TestCellUnderTheParent(t *testing.T) {
	cell := newTestCell(t, "cell-test")
	if err := cell.SetMemory(256 << 20); err != nil {
		t.Fatal(err)
	}
	if err := cell.NewChild("w1", 32<<20); err != nil {
		t.Fatal(err)
	}
	hog, allocate := startHog(t)
	if err := cell.Join("w1", hog.Process.Pid); err != nil {
		t.Fatal(err)
	}
	for _, d := range memberDirs(cell.cg, cellPrefix+"cell-test", "w1") {
		procs, _ := os.ReadFile(d + "/cgroup.procs")
		if !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(hog.Process.Pid)) {
			t.Errorf("process %d not in %s", hog.Process.Pid, d)
		}
	}
	if err := allocate(); err != nil {
		t.Fatalf("a process over its child's 32 MiB limit: %v, want SIGKILL", err)
	}
	if n := cell.OOMKills("w1"); n != 1 {
		t.Errorf("OOM kills %d, want 1", n)
	}

	// A daemon's next run makes the cell afresh, without what the last one left in it.
	sleeper := exec.Command("sleep", "100")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	if err := cell.Join("w1", sleeper.Process.Pid); err != nil {
		t.Fatal(err)
	}
	again, err := NewCell(testCgroupParent, "cell-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sleeper.Wait(); err == nil {
		t.Error("the earlier run's process survived a new cell")
	}
	for _, d := range cgroupDirs(cell.cg, cellPrefix+"cell-test", "w1") {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the earlier run's child %s is still there (%v)", d, err)
		}
	}
	if err := again.Remove(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range cgroupDirs(cell.cg, cellPrefix+"cell-test") {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after Remove (%v)", d, err)
		}
	}
}

// testCgroupParent is this package's own: package sandbox's tests, which may run at the
// same time, use and remove "sidecar-test".
var testCgroupParent = fmt.Sprintf("sidecar-test-confine-%d", os.Getpid())

// testHelperArg makes the test binary the helper (package initproc), as the daemon's
// binary is with its own argument.
const testHelperArg = "__confine-test-init"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == testHelperArg {
		initproc.Main()
	}
	code := m.Run()
	RemoveEmptyParent(testCgroupParent) // empty by now
	os.Exit(code)
}

// newTestCell makes the cell name under the test parent, removed at the end of the test;
// it skips unless the test runs as root on a host with cgroups.
func newTestCell(t *testing.T, name string) *Cell {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	cell, err := NewCell(testCgroupParent, name, nil)
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cell.Remove(context.Background()) })
	return cell
}

// memberDirs are the cgroups a process joined to child of cell id is in: on v1 the child
// where cells have children (memory, freezer), the cell itself in the other hierarchies.
func memberDirs(cg Cgroups, id, child string) []string {
	var dirs []string
	for _, ctrl := range v1Controllers {
		d := cg.Dir(ctrl, id, child)
		if cg.Version() == "v1" && ctrl != "memory" && ctrl != "freezer" {
			d = cg.Dir(ctrl, id)
		}
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// cgroupDirs are the directories of the cgroup at parts in every hierarchy.
func cgroupDirs(cg Cgroups, parts ...string) []string {
	var dirs []string
	for _, ctrl := range v1Controllers {
		if d := cg.Dir(ctrl, parts...); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

func TestCellNames(t *testing.T) {
	for _, name := range []string{"", "Scripts", "../x", "a/b", "_x", strings.Repeat("a", 33)} {
		if _, err := NewCell(testCgroupParent, name, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("NewCell(%q) = %v, want ErrInvalid", name, err)
		}
	}
}

// startHog starts a shell that, once allocate is called, execs python3 to allocate 128
// MiB: a test moves it into a cgroup first. allocate returns nil once the process died
// of SIGKILL (the OOM killer), else what its wait returned.
func startHog(t *testing.T) (hog *exec.Cmd, allocate func() error) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 to allocate with") // .ci/run installs it; the VM list must run these
	}
	hog = exec.Command("sh", "-c", "read go; exec python3 -c 'b = bytearray(128 << 20); print(len(b))'")
	stdin, err := hog.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hog.Process.Kill(); _ = hog.Wait() })
	return hog, func() error {
		stdin.Write([]byte("go\n"))
		err := hog.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL {
			return nil
		}
		if err == nil {
			err = errors.New("exited 0")
		}
		return err
	}
}
