package sandbox

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

// readyLauncher waits for the lease's launcher to be ready (its ready byte waiting on the
// socket, not read) and returns it.
func readyLauncher(t *testing.T, s *Sandbox, leaseID string) *launcher {
	t.Helper()
	s.settle()
	s.mu.Lock()
	l := s.leases[leaseID].launcher
	s.mu.Unlock()
	if !l.started() {
		t.Fatalf("lease %s has no launcher running: %+v", leaseID, l)
	}
	waitFor(t, "the launcher to be ready", func() bool {
		fds := []unix.PollFd{{Fd: int32(l.sock.Fd()), Events: unix.POLLIN}}
		n, _ := unix.Poll(fds, 0)
		return n == 1
	})
	return l
}

// A command goes to the launcher made ahead for it: it runs as that process, in that
// launcher's own new child cgroup, and the next command gets a new launcher.
func TestLauncherRunsTheNextCommand(t *testing.T) { forEachHelper(t, testLauncherRunsTheNextCommand) }

func testLauncherRunsTheNextCommand(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	if s.coldStart {
		s.settle()
		if s.leases[l.ID].launcher != nil {
			t.Fatal("a launcher with ColdStart")
		}
		return
	}
	seen := map[int]bool{}
	for i := range 3 {
		first := readyLauncher(t, s, l.ID)
		cmd, tr, err := s.Command(l.ID, sh(`echo $$; cat /proc/self/cgroup; id -u; pwd`))
		if err != nil {
			t.Fatal(err)
		}
		r := runPrepared(t, cmd, tr)
		out := lines(r.stdout)
		if len(out) < 3 {
			t.Fatalf("command %d: %+v", i, r)
		}
		if pid, _ := strconv.Atoi(out[0]); pid != first.proc.Pid || seen[pid] {
			t.Errorf("command %d ran as pid %s, want the launcher's %d (used once)", i, out[0], first.proc.Pid)
		}
		seen[first.proc.Pid] = true
		if got := tr.(*tree).child; got != first.child || !strings.Contains(r.stdout, "/"+first.child+"\n") {
			t.Errorf("command %d in child cgroup %s (%q), want the launcher's %s", i, got, r.stdout, first.child)
		}
		if uid := out[len(out)-2]; uid != strconv.Itoa(l.UID) || out[len(out)-1] != Workspace {
			t.Errorf("command %d: uid %s in %s, want %d in %s", i, uid, out[len(out)-1], l.UID, Workspace)
		}
	}
	// Teardown ends and reaps the launcher with the lease.
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
	if alive(last.proc.Pid) {
		t.Errorf("launcher %d survived Teardown", last.proc.Pid)
	}
}

// A TTY command through a launcher gets the terminal as its controlling one.
func TestLauncherTTY(t *testing.T) { forEachHelper(t, testLauncherTTY) }

func testLauncherTTY(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	if !s.coldStart {
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
	if err := dead.proc.Kill(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the launcher to exit", func() bool { // its end of the socket closed
		fds := []unix.PollFd{{Fd: int32(dead.sock.Fd()), Events: unix.POLLIN}}
		unix.Poll(fds, 0)
		return fds[0].Revents&unix.POLLHUP != 0
	})
	if r := run(t, s, l.ID, sh("echo $$")); strings.TrimSpace(r.stdout) == strconv.Itoa(dead.proc.Pid) || r.exitCode != 0 {
		t.Fatalf("after the launcher died: %+v", r)
	}
	next := readyLauncher(t, s, l.ID)
	if next == dead {
		t.Fatal("no new launcher")
	}
	if r := run(t, s, l.ID, sh("echo $$")); strings.TrimSpace(r.stdout) != strconv.Itoa(next.proc.Pid) {
		t.Errorf("the next command ran as %q, want the new launcher %d", r.stdout, next.proc.Pid)
	}
}

// A launcher waiting for the lease to be quiet waits for a command noted meanwhile (Start
// notes its command before starting it): it is not made beside that command's plain start.
func TestAwaitQuietWaitsForANotedCommand(t *testing.T) {
	s := &Sandbox{}
	le := &lease{}
	l := &launcher{made: make(chan struct{}), cancel: make(chan struct{})}
	quiet := make(chan bool, 1)
	go func() { quiet <- s.awaitQuiet(le, l, nil) }() // as Provision's refill does
	running := make(chan struct{})
	s.noteCommand(le, running) // before or after awaitQuiet looked: the same outcome
	// Quiet comes at launcherAfterReply without the note, not before the command has run
	// for launcherWhileRunning with it.
	select {
	case <-quiet:
		t.Fatal("the launcher would be made while the noted command starts")
	case <-time.After(launcherWhileRunning / 2):
	}
	close(running)
	select {
	case ok := <-quiet:
		if !ok {
			t.Fatal("awaitQuiet gave up without being canceled")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("awaitQuiet did not return after the command ended")
	}
}

// fakeLauncher is a launcher of lease le that says ready when the test writes
// initproc.LaunchReady to the returned end of its socket; made is left to the test.
func fakeLauncher(t *testing.T, s *Sandbox, le *lease) (*launcher, *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	l := &launcher{made: make(chan struct{}), cancel: make(chan struct{}), sock: os.NewFile(uintptr(fds[0]), "launch")}
	theirs := os.NewFile(uintptr(fds[1]), "launch")
	t.Cleanup(func() { l.sock.Close(); theirs.Close() })
	s.leases[le.spec.ID] = le
	le.launcher = l
	return l, theirs
}

// A command takes a launcher that is being forked once it is ready, rather than starting
// the plain way beside it; one that is not yet forked (waiting for quiet) is left alone.
func TestTakeLauncherCatchesUpWithOneBeingForked(t *testing.T) {
	s := &Sandbox{leases: map[string]*lease{}}
	le := &lease{spec: LeaseSpec{ID: "l"}}
	l, theirs := fakeLauncher(t, s, le)

	if got := s.takeLauncher(le); got != nil || le.launcher != l {
		t.Fatalf("a launcher waiting for quiet was taken (%v) or dropped (%v)", got, le.launcher)
	}

	l.forking.Store(true)
	go func() {
		time.Sleep(launcherCatchUp / 5) // it finishes forking, then sets up, then says ready
		close(l.made)
		time.Sleep(launcherCatchUp / 5)
		_, _ = theirs.Write([]byte{initproc.LaunchReady})
	}()
	if got := s.takeLauncher(le); got != l {
		t.Fatalf("took %v, want the launcher that was being forked", got)
	}
	if le.launcher != nil {
		t.Fatal("the taken launcher is still the lease's")
	}
}

// A launcher that is made but not ready within launcherCatchUp stays for a later command.
func TestTakeLauncherLeavesOneNotReady(t *testing.T) {
	s := &Sandbox{leases: map[string]*lease{}}
	le := &lease{spec: LeaseSpec{ID: "l"}}
	l, theirs := fakeLauncher(t, s, le)
	close(l.made)
	if got := s.takeLauncher(le); got != nil || le.launcher != l {
		t.Fatalf("a launcher not ready was taken (%v) or dropped (%v)", got, le.launcher)
	}
	_, _ = theirs.Write([]byte{initproc.LaunchReady})
	if got := s.takeLauncher(le); got != l {
		t.Fatalf("took %v once it was ready, want it", got)
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
	if s.coldStart {
		s.settle()
		if s.leases[l.ID].launcher != nil {
			t.Fatal("a launcher with ColdStart")
		}
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
	procs := filepath.Join(cgroupDir(s, "memory", l.ID, victim.child), "cgroup.procs")
	if err := os.WriteFile(procs, []byte(strconv.Itoa(hog.Process.Pid)), 0o644); err != nil {
		_ = hog.Process.Kill()
		t.Fatal(err)
	}
	_, _ = start.Write([]byte("\n"))
	_ = hog.Wait() // killed by the lease's memory limit
	if n := s.cg.ChildOOMKills(l.ID, victim.child); n == 0 {
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
	if pid := strings.TrimSpace(r.stdout); pid == strconv.Itoa(victim.proc.Pid) || tr.(*tree).child == victim.child {
		t.Fatalf("the command ran in the launcher whose cgroup saw the kill (pid %s, cgroup %s)", pid, victim.child)
	}
	if alive(victim.proc.Pid) {
		t.Errorf("launcher %d was kept after its cgroup saw an OOM kill", victim.proc.Pid)
	}
	if u, err := s.Usage(l.ID); err != nil || u.OOMKills != 1 {
		t.Errorf("Usage = %+v, %v; want the one OOM kill still counted", u, err)
	}
}
