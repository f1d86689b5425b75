package confine

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/kernel/cgroupfs"
)

// newTestEngine is an engine on the test parent with the cell id open, removed at the end
// of the test; it skips unless the test runs as root on a host with cgroups.
func newTestEngine(t testing.TB, id string) *Engine {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("cgroups need root")
	}
	cg, err := OpenCgroups(testCgroupParent, nil)
	if err != nil {
		t.Skip(err)
	}
	e := NewEngine(EngineConfig{Cgroups: cg})
	if err := e.Open(id, Limits{Pids: 64}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Remove(context.Background(), id); err != nil {
			t.Error(err)
		}
	})
	return e
}

// join puts a new `sleep 100` into child of cell id and returns it.
func join(t *testing.T, e *Engine, id, child string) *exec.Cmd {
	t.Helper()
	sleeper := exec.Command("sleep", "100")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	moveInto(t, e, id, child, sleeper.Process.Pid)
	return sleeper
}

// moveInto moves pid into child of cell id.
func moveInto(t *testing.T, e *Engine, id, child string, pid int) {
	t.Helper()
	files := e.cg.JoinFiles(id, child)
	if d := e.cg.ChildDir(id, child); d != "" {
		files = []string{d + "/cgroup.procs"}
	}
	for _, f := range files {
		if err := cgroupfs.WriteFile(f, strconv.Itoa(pid)); err != nil {
			t.Fatal(err)
		}
	}
}

// Usage counts an OOM kill in a child cgroup that is still there, once: v1 counts it in
// the victim's own cgroup only, v2 in the cell's as well.
func TestUsageCountsOOMKillsInLiveChildren(t *testing.T) {
	e := newTestEngine(t, "t-usage-oom-other")
	id := "t-usage-oom"
	if err := e.Open(id, Limits{MemoryBytes: 32 << 20, Pids: 64}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Remove(context.Background(), id) })
	child, err := e.takeChild(id)
	if err != nil {
		t.Fatal(err)
	}
	hog, allocate := startHog(t)
	moveInto(t, e, id, child, hog.Process.Pid)
	if err := allocate(); err != nil {
		t.Fatalf("a process over its cell's 32 MiB: %v, want SIGKILL", err)
	}
	e.Settle(id)
	if u, err := e.Usage(id); err != nil || u.OOMKills != 1 {
		t.Errorf("Usage = %+v, %v; want 1 OOM kill", u, err)
	}
}

// Children come from spares made ahead, each taken once; a returned spare is taken again;
// a dropped child goes in the background; Close removes the spares and leaves the cell.
func TestEngineChildren(t *testing.T) {
	e := newTestEngine(t, "t-engine-children")
	id := "t-engine-children"
	first, err := e.takeChild(id)
	if err != nil {
		t.Fatal(err)
	}
	e.Settle(id)
	second, err := e.takeChild(id) // the spare made meanwhile
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Fatalf("child %s taken twice", first)
	}
	e.returnSpare(id, second)
	if again, _ := e.takeChild(id); again != second {
		t.Errorf("took %s, want the returned spare %s", again, second)
	}
	if err := e.dropChild(id, first); err != nil {
		t.Fatal(err)
	}
	e.Settle(id)
	if _, err := os.Stat(e.cg.Dir("memory", id, first)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dropped child %s still there (%v)", first, err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	kids, _ := os.ReadDir(e.cg.Dir("memory", id))
	for _, k := range kids {
		if k.IsDir() && k.Name() != second {
			t.Errorf("child %s left after Close", k.Name())
		}
	}
}

// A closed tree's child that still holds processes is kept as leftovers, listed until it
// empties, then pruned; Usage counts the cell's processes.
func TestEngineLeftovers(t *testing.T) {
	e := newTestEngine(t, "t-engine-leftovers")
	id := "t-engine-leftovers"
	child, err := e.takeChild(id)
	if err != nil {
		t.Fatal(err)
	}
	if e.keepLeftovers(id, child) {
		t.Fatal("an empty child kept as leftovers")
	}
	sleeper := join(t, e, id, child)
	if !e.keepLeftovers(id, child) {
		t.Fatal("a child with a process not kept")
	}
	if pids := e.LeftoverPids(id); !slices.Contains(pids, sleeper.Process.Pid) {
		t.Fatalf("leftovers %v, want %d", pids, sleeper.Process.Pid)
	}
	if u, err := e.Usage(id); err != nil || u.Pids < 1 {
		t.Errorf("Usage = %+v, %v; want the sleeper counted", u, err)
	}
	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for len(e.LeftoverPids(id)) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	e.PruneLeftovers("")
	if _, err := os.Stat(e.cg.Dir("memory", id, child)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("emptied leftover child %s not pruned (%v)", child, err)
	}
}

// Sweep kills and removes the cells known does not know, but named cells.
func TestEngineSweep(t *testing.T) {
	e := newTestEngine(t, "t-engine-sweep")
	named := newTestCell(t, "sweep-named")
	orphan := "t-engine-orphan"
	if err := e.cg.Provision(orphan, Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := e.cg.NewChild(orphan, "p1"); err != nil {
		t.Fatal(err)
	}
	sleeper := join(t, e, orphan, "p1")
	// Others' cells under the shared test parent are known: only these two are not.
	removed, pids, err := e.Sweep(context.Background(), func(id string) bool { return id != orphan && id != named.id })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{orphan}) || !slices.Contains(pids, sleeper.Process.Pid) {
		t.Errorf("Sweep removed %v, killed %v; want %s and %d", removed, pids, orphan, sleeper.Process.Pid)
	}
	if _, err := os.Stat(named.ChildDir("")); err != nil {
		t.Errorf("Sweep took the named cell: %v", err)
	}
}

// Kill leaves no process of the cell running user code, a forking one included, and the
// cgroups in place; Remove then waits for the exits and removes them.
func TestEngineKillThenRemove(t *testing.T) {
	id := "t-engine-kill"
	e := newTestEngine(t, id)
	child, err := e.takeChild(id)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	// Each waits for a line on stdin, sent once it is in the cell, so that nothing it
	// starts is born outside.
	inCell := func(script string) {
		cmd := exec.Command("sh", "-c", "read _; "+script)
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		moveInto(t, e, id, child, cmd.Process.Pid)
		if _, err := in.Write([]byte("go\n")); err != nil {
			t.Fatal(err)
		}
	}
	inCell("while :; do sleep 100 & done")
	inCell("while :; do echo x >> " + out + "; done")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		pids, _ := cgroupfs.Pids(e.cg.Dir("freezer", id))
		if fi, err := os.Stat(out); err == nil && fi.Size() > 0 && len(pids) > 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the forker's children and the writer's lines never showed")
		}
	}

	if err := e.Kill(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	killed, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range cgroupDirs(e.cg, id) {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("cgroup %s after Kill: %v (Remove's to remove)", dir, err)
		}
	}
	// The writer may finish the one write it was in; no loop turn follows, however long
	// one looks.
	time.Sleep(100 * time.Millisecond)
	if later, err := os.Stat(out); err != nil || later.Size() > killed.Size()+int64(len("x\n")) {
		t.Errorf("the writer wrote on after Kill: %d bytes then, %d later (%v)", killed.Size(), later.Size(), err)
	}
	if err := e.Remove(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	for _, dir := range cgroupDirs(e.cg, id) {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s after Remove: %v", dir, err)
		}
	}
}
