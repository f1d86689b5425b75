package confine

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

// startEngine is an engine whose helper is the test binary, with the cell id open.
func startEngine(t *testing.T, id string) *Engine {
	t.Helper()
	e := newTestEngine(t, id)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e.helper, e.helperArg = self, testHelperArg
	return e
}

// base is a Start with no policy at all: root, the host's view, no filter.
func base() Start { return Start{Dir: "/", Config: initproc.Config{}} }

// startWaiting starts `read x` in cell id with its stdin a pipe (which a launcher can
// take) and returns its tree, its command's pid, and the write end that ends it.
func startWaiting(t *testing.T, e *Engine, id string) (Tree, int, func()) {
	t.Helper()
	st := base()
	st.Config.Argv, st.Config.Env, st.Config.Dir = []string{"/bin/sh", "-c", "read x"}, []string{"PATH=/usr/bin:/bin"}, "/"
	cmd, tr, err := e.Command(id, st)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = r
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	return tr, cmd.Process.Pid, func() {
		w.Close()
		if _, err := cmd.Process.Wait(); err != nil {
			t.Error(err)
		}
		if err := tr.Close(); err != nil {
			t.Error(err)
		}
	}
}

// Without a template a tree starts the plain way, in a child cgroup of its own; with one,
// it goes to the launcher made ahead: that process, in that launcher's child cgroup.
func TestEngineCommand(t *testing.T) {
	id := "t-engine-command"
	e := startEngine(t, id)

	tr, pid, end := startWaiting(t, e, id)
	child := tr.(interface{ Cgroup() string }).Cgroup()
	if pids, _ := e.cg.ChildPids(id, child); !slices.Contains(pids, pid) {
		t.Errorf("plain start: pid %d not in its child cgroup %s (%v)", pid, child, pids)
	}
	end()

	e.SetTemplate(id, base)
	e.Settle(id)
	l, ok := e.Launcher(id)
	for deadline := time.Now().Add(10 * time.Second); ok && !l.Ready && !l.Gone && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		l, ok = e.Launcher(id)
	}
	if !ok || l.Gone {
		t.Fatalf("no launcher ready: %+v, %v", l, ok)
	}
	tr, pid, end = startWaiting(t, e, id)
	defer end()
	if child := tr.(interface{ Cgroup() string }).Cgroup(); pid != l.PID || child != l.Cgroup {
		t.Errorf("ran as %d in %s, want the launcher %d in %s", pid, child, l.PID, l.Cgroup)
	}
	if pids, _ := e.cg.ChildPids(id, l.Cgroup); !slices.Contains(pids, pid) {
		t.Errorf("launched: pid %d not in the launcher's cgroup %s (%v)", pid, l.Cgroup, pids)
	}
}

// A zygote whose set-up fails is reported, with the helper's reason, as the zygote that
// exited, not as one that never answered: the daemon keeps no copy of the zygote's end of
// their socket while it waits (else the wait would last zygoteWait, and a daemon stopping
// beside a zygote being made would stop that much later).
func TestZygoteSetUpFailureEndsTheWait(t *testing.T) {
	id := "t-zygote-setup-failure"
	e := startEngine(t, id)
	// The helper here is this test binary, whose Go set-up refuses to be a zygote (only
	// the C helper can fork and go on): a set-up failure every run.
	st := base()
	cfg := st.Config
	cfg.Await, cfg.Fork = true, true
	key, err := initproc.Encode(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	z, err := e.startZygote(e.live(id), st, key)
	if err == nil {
		e.endZygote(id, z)
		t.Fatal("the Go helper started as a zygote")
	}
	if msg := err.Error(); !strings.Contains(msg, "exited before it was ready") || !strings.Contains(msg, "a zygote needs the C helper") {
		t.Fatalf("zygote set-up failure: %v, want the zygote's exit with its reason", err)
	}
}

// A finished tree's emptied child cgroup is the cell's next tree's, so commands in a row
// make no new cgroup; one that still holds a command's leftovers, or one in which the
// kernel OOM-killed a process, is never another tree's (a reused child would make the
// next command's oom_killed speak of an earlier one).
func TestTreesReuseEmptiedChildren(t *testing.T) {
	id := "t-engine-reuse"
	e := startEngine(t, id)
	if err := e.Open(id, Limits{MemoryBytes: 64 << 20, Pids: 64}); err != nil {
		t.Fatal(err)
	}
	run := func(script string) (child string, oomKilled bool) {
		t.Helper()
		st := base()
		st.Config.Argv, st.Config.Env, st.Config.Dir = []string{"/bin/sh", "-c", script}, []string{"PATH=/usr/bin:/bin"}, "/"
		cmd, tr, err := e.Command(id, st)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Start(); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		child, oomKilled = tr.(interface{ Cgroup() string }).Cgroup(), tr.OOMKilled()
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		return child, oomKilled
	}

	first, _ := run("true")
	for i := range 3 {
		if child, _ := run("true"); child != first {
			t.Fatalf("command %d in child %s, want the emptied %s again", i+2, child, first)
		}
	}

	held, _ := run("sleep 60 >/dev/null 2>&1 &")
	if pids, _ := e.cg.ChildPids(id, held); len(pids) == 0 {
		t.Fatalf("the background sleep is not in %s", held)
	}
	if child, _ := run("true"); child == held {
		t.Errorf("a command ran in %s, which holds another command's leftovers", held)
	}

	// tail keeps a "line" that never ends in memory: over the cell's 64 MiB.
	hog, oomKilled := run("head -c 400000000 /dev/zero | tail")
	if !oomKilled {
		t.Fatalf("the hog in %s was not OOM-killed", hog)
	}
	if child, oomKilled := run("true"); child == hog || oomKilled {
		t.Errorf("the next command in %s, oom_killed %v; want another child, not OOM-killed", child, oomKilled)
	}
	e.Settle(id)
	if _, err := os.Stat(e.cg.MemoryDir(id, hog)); !os.IsNotExist(err) {
		t.Errorf("the OOM-killed command's child %s is still there (%v)", hog, err)
	}
}
