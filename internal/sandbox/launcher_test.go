package sandbox

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/confine"
	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

// readyLauncher waits for the lease's launcher to be ready (its ready byte waiting on the
// socket, not read) and returns it.
func readyLauncher(t *testing.T, s *Sandbox, leaseID string) confine.LauncherState {
	t.Helper()
	s.settle()
	l, ok := s.eng.Launcher(leaseID)
	if !ok {
		t.Fatalf("lease %s has no launcher running", leaseID)
	}
	waitFor(t, "the launcher to be ready", func() bool {
		l, ok = s.eng.Launcher(leaseID)
		return ok && l.Ready
	})
	return l
}

// cold says whether the subtest runs with ColdStart (forEachHelper's "c-cold").
func cold(t *testing.T) bool { return strings.HasSuffix(t.Name(), "-cold") }

// noLauncher fails t if the lease has a launcher.
func noLauncher(t *testing.T, s *Sandbox, leaseID string) {
	t.Helper()
	s.settle()
	if _, ok := s.eng.Launcher(leaseID); ok {
		t.Fatal("a launcher with ColdStart")
	}
}

// A command goes to the launcher made ahead for it: it runs as that process, in that
// launcher's own child cgroup, and the next command gets a new launcher.
func TestLauncherRunsTheNextCommand(t *testing.T) { forEachHelper(t, testLauncherRunsTheNextCommand) }

func testLauncherRunsTheNextCommand(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	if cold(t) {
		noLauncher(t, s, l.ID)
		return
	}
	seen := map[int]bool{}
	for i := range 3 {
		first := readyLauncher(t, s, l.ID)
		// Seen from the host (the lease's own view is its cgroup namespace's root): the
		// process the command will run as is in the launcher's child cgroup already.
		inCgroup, err := os.ReadFile("/proc/" + strconv.Itoa(first.PID) + "/cgroup")
		if err != nil {
			t.Fatal(err)
		}
		cmd, tr, err := s.Command(l.ID, sh(`echo $$; id -u; pwd`))
		if err != nil {
			t.Fatal(err)
		}
		r := runPrepared(t, cmd, tr)
		out := lines(r.stdout)
		if len(out) < 3 {
			t.Fatalf("command %d: %+v", i, r)
		}
		if pid, _ := strconv.Atoi(out[0]); pid != first.PID || seen[pid] {
			t.Errorf("command %d ran as pid %s, want the launcher's %d (used once)", i, out[0], first.PID)
		}
		seen[first.PID] = true
		if got := treeCgroup(tr); got != first.Cgroup || !strings.Contains(string(inCgroup), "/"+first.Cgroup+"\n") {
			t.Errorf("command %d in child cgroup %s (%q), want the launcher's %s", i, got, inCgroup, first.Cgroup)
		}
		if uid := out[len(out)-2]; uid != strconv.Itoa(l.UID) || out[len(out)-1] != Workspace {
			t.Errorf("command %d: uid %s in %s, want %d in %s", i, uid, out[len(out)-1], l.UID, Workspace)
		}
	}
	// Teardown kills the launcher with the lease, Retire reaps it.
	last := readyLauncher(t, s, l.ID)
	// The launcher's threads are left out of the lease's pids (once the last command's
	// exit is accounted: v2 counts a task until it is freed).
	waitFor(t, "the lease's pids to be 0 beside its launcher", func() bool {
		u, err := s.Usage(l.ID)
		return err == nil && u.Pids == 0
	})
	if err := s.Teardown(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Retire(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(last.PID)); !os.IsNotExist(err) {
		t.Errorf("launcher %d not reaped by Retire: %v", last.PID, err)
	}
}

// A TTY command through a launcher gets the terminal as its controlling one.
func TestLauncherTTY(t *testing.T) { forEachHelper(t, testLauncherTTY) }

func testLauncherTTY(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	if !cold(t) {
		readyLauncher(t, s, l.ID)
	}
	cmd, tr, err := s.Command(l.ID, Spec{Argv: []string{"/bin/sh", "-c", `tty; echo $TERM; : </dev/tty && echo controlling`}, TTY: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	out := strings.ReplaceAll(runTTY(t, s, l.ID, cmd, tr), "\r", "")
	if !strings.Contains(out, "/dev/pts/0\nxterm-256color\ncontrolling\n") {
		t.Errorf("TTY command printed %q, want its tty as controlling terminal", out)
	}
}

// A launcher that died while waiting costs nothing but a plain start: the command runs,
// and a new launcher is made.
func TestLauncherDeadFallsBack(t *testing.T) {
	s := newTestSandbox(t)
	l := newTestLease(t, s, nil)
	dead := readyLauncher(t, s, l.ID)
	if err := syscall.Kill(dead.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the launcher to exit", func() bool { // its end of the socket closed
		l, ok := s.eng.Launcher(l.ID)
		return ok && l.Gone
	})
	if r := run(t, s, l.ID, sh("echo $$")); strings.TrimSpace(r.stdout) == strconv.Itoa(dead.PID) || r.exitCode != 0 {
		t.Fatalf("after the launcher died: %+v", r)
	}
	next := readyLauncher(t, s, l.ID)
	if next.PID == dead.PID {
		t.Fatal("no new launcher")
	}
	if r := run(t, s, l.ID, sh("echo $$")); strings.TrimSpace(r.stdout) != strconv.Itoa(next.PID) {
		t.Errorf("the next command ran as %q, want the new launcher %d", r.stdout, next.PID)
	}
}

// A launcher whose cgroup saw an OOM kill (made while the lease was at its memory limit) is
// not given the next command: that command would be reported OOM-killed. Here a memory
// hog is put in the ready launcher's cgroup, by hand, and killed there by the lease's limit.
func TestLauncherAfterOOMKillIsNotUsed(t *testing.T) {
	forEachHelper(t, testLauncherAfterOOMKillIsNotUsed)
}

func testLauncherAfterOOMKillIsNotUsed(t *testing.T, s *Sandbox) {
	// 128 MiB, so that the hog is the lease's largest process when the limit stops it
	// (the Go helper built with -race holds 36 MiB).
	l := newTestLease(t, s, func(l *LeaseSpec) { l.MemoryBytes = 128 << 20 })
	if cold(t) {
		noLauncher(t, s, l.ID)
		return
	}
	victim := readyLauncher(t, s, l.ID)
	hog := exec.Command("sh", "-c", `read go; a=x; while :; do a="$a$a"; done`)
	start, err := hog.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	// The hog is this test's process, not a lease's: it gets the score the sandbox gives
	// lease processes, not the one this process inherited (a unit's OOMScoreAdjust=).
	adj := fmt.Sprintf("/proc/%d/oom_score_adj", hog.Process.Pid)
	procs := filepath.Join(cgroupDir(s, "memory", l.ID, victim.Cgroup), "cgroup.procs")
	if err := os.WriteFile(adj, []byte(initproc.LeaseOOMScoreAdj), 0o644); err != nil {
		_ = hog.Process.Kill()
		t.Fatal(err)
	}
	if err := os.WriteFile(procs, []byte(strconv.Itoa(hog.Process.Pid)), 0o644); err != nil {
		_ = hog.Process.Kill()
		t.Fatal(err)
	}
	_, _ = start.Write([]byte("\n"))
	_ = hog.Wait() // killed by the lease's memory limit
	if n := s.cg.ChildOOMKills(l.ID, victim.Cgroup); n == 0 {
		t.Fatalf("the hog ended (%v) without an OOM kill in the launcher's cgroup", hog.ProcessState)
	}
	cmd, tr, err := s.Command(l.ID, sh(`echo $$`))
	if err != nil {
		t.Fatal(err)
	}
	r := runPrepared(t, cmd, tr)
	if r.oom || r.exitCode != 0 {
		t.Fatalf("the command after the kill: %+v, want a clean exit", r)
	}
	if pid := strings.TrimSpace(r.stdout); pid == strconv.Itoa(victim.PID) || treeCgroup(tr) == victim.Cgroup {
		t.Fatalf("the command ran in the launcher whose cgroup saw the kill (pid %s, cgroup %s)", pid, victim.Cgroup)
	}
	if alive(victim.PID) {
		t.Errorf("launcher %d was kept after its cgroup saw an OOM kill", victim.PID)
	}
	if u, err := s.Usage(l.ID); err != nil || u.OOMKills != 1 {
		t.Errorf("Usage = %+v, %v; want the one OOM kill still counted", u, err)
	}
}

// With the C helper, a lease's launchers are forks of its zygote, whether made ahead or
// for a command that found none ready: commands run in the one mount namespace the zygote
// made, yet each in a child cgroup of its own at the root of its own cgroup namespace.
// A helper started per command (the Go one, or any with ColdStart) makes a namespace
// each time, which shows the test can fail: the first command, still running, holds its
// own while the others start.
func TestZygoteSharesOneView(t *testing.T) { forEachHelper(t, testZygoteSharesOneView) }

func testZygoteSharesOneView(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	forked := strings.HasSuffix(t.Name(), "/c")
	if !cold(t) {
		readyLauncher(t, s, l.ID)
	}
	view := `readlink /proc/self/ns/mnt; sed 's/^[^:]*:[^:]*:/path /' /proc/self/cgroup | sort -u; id -u`
	first, tr, err := s.Command(l.ID, sh(view+`; read x`))
	if err != nil {
		t.Fatal(err)
	}
	hold, release, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer release.Close()
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	first.Stdin, first.Stdout = hold, out
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	hold.Close()
	defer func() { release.Close(); _ = first.Wait(); tr.Close() }()
	var ns string
	waitFor(t, "the first command's view", func() bool {
		b, _ := os.ReadFile(out.Name())
		got := lines(string(b))
		if len(got) == 3 {
			ns = got[0]
		}
		return ns != ""
	})
	// The later commands run one after another, so they may share an emptied child; never
	// the first's, which still runs.
	firstCgroup := treeCgroup(tr)
	cgroups := map[string]bool{firstCgroup: true}
	for i := range 3 {
		cmd, tr, err := s.Command(l.ID, sh(view))
		if err != nil {
			t.Fatal(err)
		}
		r := runPrepared(t, cmd, tr)
		got := lines(r.stdout)
		if r.exitCode != 0 || len(got) != 3 || got[1] != "path /" || got[2] != strconv.Itoa(l.UID) {
			t.Fatalf("command %d: %+v, want its mount namespace, path / and uid %d", i, r, l.UID)
		}
		if same := got[0] == ns; same != forked {
			t.Errorf("command %d in mount namespace %s, the first in %s: want the same: %v", i, got[0], ns, forked)
		}
		if c := treeCgroup(tr); c == firstCgroup {
			t.Errorf("command %d in %s, the child cgroup of the first command, which still runs", i, c)
		} else {
			cgroups[c] = true
		}
	}
	if len(cgroups) < 2 || !cgroups[firstCgroup] {
		t.Errorf("commands in child cgroups %v, want the ones run while the first held %s in another", cgroups, firstCgroup)
	}
}

// A zygote that died costs nothing but plain starts: commands still run, and the next
// launcher is forked by a new zygote.
func TestZygoteDeadFallsBack(t *testing.T) {
	s := newTestSandboxWith(t, cHelperPath(t))
	l := newTestLease(t, s, nil)
	first := readyLauncher(t, s, l.ID)
	if first.Zygote == 0 {
		t.Fatal("the C helper's launcher was not forked by a zygote")
	}
	if err := syscall.Kill(first.Zygote, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // the first takes the launcher; the others find none ready
		if r := run(t, s, l.ID, sh("id -u")); strings.TrimSpace(r.stdout) != strconv.Itoa(l.UID) || r.exitCode != 0 {
			t.Fatalf("command %d after the zygote died: %+v", i, r)
		}
	}
	next := readyLauncher(t, s, l.ID)
	if next.Zygote == 0 || next.Zygote == first.Zygote {
		t.Errorf("after the zygote %d died, the next launcher's zygote is %d, want a new one", first.Zygote, next.Zygote)
	}
	if alive(first.Zygote) {
		t.Errorf("the killed zygote %d was not reaped", first.Zygote)
	}
}

// A host that replaces its /etc/group by rename (groupadd does; DHCP clients and
// systemd-resolved do with resolv.conf) detaches the lease's bind on it in every mount
// namespace. A zygote binds it again before it forks the next launcher: from then on the
// lease sees its own file again, its running processes included, and the host's mount
// table is left as it was. It renames over the host's file, so it runs where the host is
// disposable: make vm-test sets SIDECAR_TEST_DISPOSABLE_HOST.
func TestUserFilesOutliveAHostRename(t *testing.T) {
	if os.Getenv("SIDECAR_TEST_DISPOSABLE_HOST") != "1" {
		t.Skip("renames over the host's /etc/group: runs in make vm-test (SIDECAR_TEST_DISPOSABLE_HOST=1)")
	}
	forEachHelper(t, testUserFilesOutliveAHostRename)
}

func testUserFilesOutliveAHostRename(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	group := func() string {
		t.Helper()
		if !cold(t) {
			readyLauncher(t, s, l.ID)
		}
		cmd, tr, err := s.Command(l.ID, Spec{Argv: []string{"cat", "/etc/group"}})
		if err != nil {
			t.Fatal(err)
		}
		r := runPrepared(t, cmd, tr)
		if r.exitCode != 0 {
			t.Fatalf("cat /etc/group: %+v", r)
		}
		return r.stdout
	}
	host, err := os.ReadFile("/etc/group")
	if err != nil {
		t.Fatal(err)
	}
	own := group()
	if own == string(host) || !strings.Contains(own, LeaseUser+":") {
		t.Fatalf("the lease's /etc/group is the host's or lacks %s:\n%s", LeaseUser, own)
	}
	renameOverGroup(t, host)
	group() // a launcher forked before the rename may run it in the detached view
	if got := group(); got != own {
		t.Fatalf("after the host's rename the lease sees:\n%s\nwant its own:\n%s", got, own)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == "/etc/group" {
			t.Fatalf("the host's mount table holds a mount on /etc/group: %s", line)
		}
	}
}

// renameOverGroup puts host, the host's /etc/group, in a new file and renames that over
// /etc/group: what groupadd does.
func renameOverGroup(t *testing.T, host []byte) {
	t.Helper()
	next := "/etc/group.sidecar-test"
	if err := os.WriteFile(next, host, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, "/etc/group"); err != nil {
		t.Fatal(err)
	}
}

// The same rename while the lease runs no command: its long-running process (a server,
// say) sees the lease's own file again once the daemon saw the rename, without waiting
// for the next command. The next launcher is ready before the rename, so no fork heals
// the view: the watch on the host's files must. Only zygotes (the C helper's) keep a view
// to heal; a plain start makes each command's afresh.
func TestUserFilesHealWhileALeaseIsIdle(t *testing.T) {
	if os.Getenv("SIDECAR_TEST_DISPOSABLE_HOST") != "1" {
		t.Skip("renames over the host's /etc/group: runs in make vm-test (SIDECAR_TEST_DISPOSABLE_HOST=1)")
	}
	s := newTestSandboxWith(t, cHelperPath(t))
	l := newTestLease(t, s, nil)
	host, err := os.ReadFile("/etc/group")
	if err != nil {
		t.Fatal(err)
	}
	readyLauncher(t, s, l.ID)
	cmd, tr, err := s.Command(l.ID, sh(`i=0; while [ $i -lt 1200 ]; do i=$((i+1))
		if grep -q '^`+LeaseUser+`:' /etc/group; then echo own; else echo host; fi; sleep 0.05; done`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = out
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); tr.Close() }()
	seen := func() []string {
		b, _ := os.ReadFile(out.Name())
		return strings.Fields(string(b))
	}
	waitFor(t, "the loop to see the lease's own /etc/group", func() bool {
		got := seen()
		return len(got) > 0 && got[len(got)-1] == "own"
	})
	if state := readyLauncher(t, s, l.ID); state.Zygote == 0 {
		t.Fatal("the C helper's launcher was not forked by a zygote")
	}
	renameOverGroup(t, host)
	n := len(seen()) // the line after may have read before the rename
	waitFor(t, "the idle lease's loop to see its own /etc/group again", func() bool {
		got := seen()
		return len(got) > n+1 && got[len(got)-1] == "own"
	})
}

// A heal the daemon asks for (the host replaced none of the lease's files here) leaves
// the zygote serving: the next launcher is its fork.
func TestZygoteHealKeepsItServing(t *testing.T) {
	s := newTestSandboxWith(t, cHelperPath(t))
	l := newTestLease(t, s, nil)
	first := readyLauncher(t, s, l.ID)
	if first.Zygote == 0 {
		t.Fatal("the C helper's launcher was not forked by a zygote")
	}
	s.eng.Heal()
	if r := run(t, s, l.ID, sh("id -u")); strings.TrimSpace(r.stdout) != strconv.Itoa(l.UID) || r.exitCode != 0 {
		t.Fatalf("command after a heal: %+v", r)
	}
	if next := readyLauncher(t, s, l.ID); next.Zygote != first.Zygote {
		t.Errorf("after a heal the next launcher's zygote is %d, want %d", next.Zygote, first.Zygote)
	}
}
