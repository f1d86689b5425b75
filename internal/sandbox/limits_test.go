package sandbox

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/confine"
	"github.com/sidecar-sandbox/sidecar/internal/kernel/cgroupfs"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testtool.WaitFor(t, what, 10*time.Second, cond)
}

// A fork bomb stops at the lease's pids limit, and another lease keeps working.
func TestForkBombStopsAtPidsLimit(t *testing.T) { forEachHelper(t, testForkBombStopsAtPidsLimit) }

func testForkBombStopsAtPidsLimit(t *testing.T, s *Sandbox) {
	a := newTestLease(t, s, func(l *LeaseSpec) { l.Pids = 40 })
	b := newTestLease(t, s, nil)
	cmd, tr, err := s.Command(a.ID, sh(`bomb() { bomb | bomb & }; bomb 2>/dev/null; sleep 100`))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	// Refused forks are counted in the forking cgroup (v1: the lease's, where commands
	// stay in the pids hierarchy; v2 before Linux 6.12: the command's child) or in the one
	// whose limit was hit and above (v2 since: the lease's).
	waitFor(t, "a fork refused by pids.max", func() bool {
		inLease, _ := cgroupfs.ReadKey(filepath.Join(cgroupDir(s, "pids", a.ID), "pids.events"), "max")
		inChild, _ := cgroupfs.ReadKey(filepath.Join(cgroupDir(s, "pids", a.ID, treeCgroup(tr)), "pids.events"), "max")
		return inLease+inChild > 0
	})
	if u, err := s.Usage(a.ID); err != nil || u.Pids > 40 {
		t.Errorf("Usage = %+v, %v; want pids <= 40", u, err)
	}
	if r := run(t, s, b.ID, sh("echo ok")); strings.TrimSpace(r.stdout) != "ok" {
		t.Errorf("lease B during A's fork bomb: %+v", r)
	}
	if err := tr.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	cmd.Wait()
	// Killed orphans are zombies until the reaper (this process is a subreaper) gets them.
	waitFor(t, "lease A's pids to drop to 0", func() bool {
		u, _ := s.Usage(a.ID)
		return u.Pids == 0
	})
}

func TestMemoryHogIsOOMKilled(t *testing.T) { forEachHelper(t, testMemoryHogIsOOMKilled) }

func testMemoryHogIsOOMKilled(t *testing.T, s *Sandbox) {
	// 128 MiB, so that the hog is the largest process of the lease when the limit stops
	// it: the next launcher, made while the hog runs, is a process of the lease too, and
	// the Go helper built with -race holds 36 MiB (with 32 MiB the kernel killed it first).
	l := newTestLease(t, s, func(l *LeaseSpec) { l.MemoryBytes = 128 << 20 })
	// The shell doubles a string until the limit stops it (no interpreter needed: the VM
	// tests have only busybox).
	r := run(t, s, l.ID, sh(`a=x; while :; do a="$a$a"; done; echo survived`))
	if !r.signaled || !r.oom || strings.Contains(r.stdout, "survived") {
		t.Fatalf("memory hog: %+v, want OOM-killed", r)
	}
	if r := run(t, s, l.ID, sh("true")); r.oom {
		t.Errorf("a later command is reported OOM-killed too")
	}
	if u, err := s.Usage(l.ID); err != nil || u.OOMKills != 1 { // exactly one: a child being removed is not counted twice
		t.Errorf("Usage = %+v, %v; want OOMKills 1", u, err)
	}
}

// Tree.Kill takes children, grandchildren, setsid'd and double-forked descendants.
func TestTreeKillTakesEverything(t *testing.T) { forEachHelper(t, testTreeKillTakesEverything) }

func testTreeKillTakesEverything(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	cmd, tr, err := s.Command(l.ID, sh(`sleep 100.1 & setsid sleep 100.2 & (sh -c 'sleep 100.3 &' &) ; sh -c 'sleep 100.4' & echo ready; wait`))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	out, _ := cmd.StdoutPipe()
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("got %q", line)
	}
	dir := cgroupDir(s, "freezer", l.ID, treeCgroup(tr))
	pids := waitForSleepers(t, dir, "100.1", "100.2", "100.3", "100.4")
	if err := tr.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if left, _ := cgroupfs.Pids(dir); len(left) != 0 {
		t.Errorf("after Kill: %v left", left)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("Wait: want killed")
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d alive after Kill", pid)
		}
	}
}

// waitForSleepers waits until the cgroup dir (and its descendants) holds a `sleep D` for
// each duration D, and returns all its pids. Durations mark the processes: which of the
// shells exec their last command instead of forking differs between shells (dash,
// busybox ash), the sleepers do not.
func waitForSleepers(t *testing.T, dir string, durations ...string) []int {
	t.Helper()
	var pids []int
	var seen []string
	err := pollUntil(context.Background(), 10*time.Second, func() (bool, error) {
		pids, _ = cgroupfs.Pids(dir)
		seen = seen[:0]
		for _, pid := range pids {
			b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
			seen = append(seen, strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")))
		}
		for _, d := range durations {
			if !slices.Contains(seen, "sleep "+d) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("waiting for sleep %v in %s: %v; processes there: %q", durations, dir, err, seen)
	}
	return pids
}

// alive: exists, is not a zombie (an orphan may wait for its reaper) and is not exiting.
// A killed process leaves its cgroup, which may then report itself empty, before it is a
// zombie; from the start of its exit it has PF_EXITING set and never runs user code again.
// uptimeTicks is the time since boot in clock ticks (USER_HZ, 100), as /proc/<pid>/stat
// gives a process's start.
func uptimeTicks(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	secs, frac, _ := strings.Cut(strings.Fields(string(b))[0], ".")
	n, err := strconv.ParseUint(secs+(frac + "00")[:2], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// startTicks is when process pid started, in clock ticks since boot.
func startTicks(pid string) (uint64, bool) {
	f := procStat(pid)
	if len(f) < 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(f[19], 10, 64)
	return n, err == nil
}

// procStat is /proc/<pid>/stat's fields after the command name (state ppid pgrp session
// tty tpgid flags … starttime is the 20th), nil if there is no such process. The name may
// hold spaces and parentheses: the fields start after its last ") ".
func procStat(pid string) []string {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	i := strings.LastIndex(string(b), ") ")
	if err != nil || i < 0 {
		return nil
	}
	return strings.Fields(string(b)[i+2:])
}

func alive(pid int) bool {
	const pfExiting = 0x4
	f := procStat(strconv.Itoa(pid))
	if len(f) < 7 || f[0] == "Z" || f[0] == "X" {
		return false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err != nil || flags&pfExiting == 0
}

func TestNetworkNamespace(t *testing.T) { forEachHelper(t, testNetworkNamespace) }

func testNetworkNamespace(t *testing.T, s *Sandbox) {
	needPython(t)
	const resolv = "nameserver 127.0.0.1\n"
	l := newTestLease(t, s, func(l *LeaseSpec) {
		l.Network = &LeaseNetwork{Env: []string{"HTTP_PROXY=http://127.0.0.1:3128"}, ResolvConf: resolv}
	})
	if r := run(t, s, l.ID, sh(`cat /etc/resolv.conf; echo "$HTTP_PROXY"`)); r.stdout != resolv+"http://127.0.0.1:3128\n" {
		t.Errorf("the lease's resolv.conf and proxy: %q %s", r.stdout, r.stderr)
	}
	r := run(t, s, l.ID, sh(`tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; /usr/bin/python3 -c "
import socket
s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()
socket.create_connection(s.getsockname()); print('lo up')"; readlink /proc/self/ns/net`))
	out := lines(r.stdout)
	if len(out) != 3 || out[0] != "lo" || out[1] != "lo up" {
		t.Fatalf("want only lo, up: %q %s", out, r.stderr)
	}
	own, _ := os.Readlink("/proc/self/ns/net")
	if out[2] == own {
		t.Errorf("lease shares the daemon's network namespace %s", own)
	}
	// One namespace per lease: a second process is in the same one, so a server and an
	// exec of the same lease can talk over loopback.
	if r2 := run(t, s, l.ID, Spec{Argv: []string{"readlink", "/proc/self/ns/net"}}); strings.TrimSpace(r2.stdout) != out[2] {
		t.Errorf("second process in %q, first in %q", r2.stdout, out[2])
	}
	host := newTestLease(t, s, nil)
	if r := run(t, s, host.ID, Spec{Argv: []string{"readlink", "/proc/self/ns/net"}}); strings.TrimSpace(r.stdout) != own {
		t.Errorf("network host lease in %q, want the host's %q", r.stdout, own)
	}
	if ns, err := s.NetNS(l.ID); err != nil || ns == nil {
		t.Errorf("NetNS: %v %v", ns, err)
	}
}

// Teardown leaves no process, cgroup or network namespace.
func TestTeardownLeavesNothing(t *testing.T) { forEachHelper(t, testTeardownLeavesNothing) }

func testTeardownLeavesNothing(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, func(l *LeaseSpec) { l.Network = &LeaseNetwork{} })
	cmd, tr, err := s.Command(l.ID, sh(`(setsid sh -c 'sleep 100.1 & sleep 100.2' &); echo ready; sleep 100.3`))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	out, _ := cmd.StdoutPipe()
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	bufio.NewReader(out).ReadString('\n')
	pids := waitForSleepers(t, cgroupDir(s, "freezer", l.ID), "100.1", "100.2", "100.3")
	s.mu.Lock()
	var st syscall.Stat_t
	syscall.Fstat(int(s.leases[l.ID].netns.Fd()), &st)
	s.mu.Unlock()
	netns := "net:[" + strconv.FormatUint(st.Ino, 10) + "]"

	tornDown := uptimeTicks(t)
	if err := s.Teardown(context.Background(), l.ID); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	cmd.Wait()
	if err := s.Retire(context.Background(), l.ID); err != nil {
		t.Fatalf("Retire: %v", err)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("pid %d alive after Teardown and Retire", pid)
		}
	}
	for _, dir := range cgroupDirs(s, l.ID) {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("lease cgroup %s still there (%v)", dir, err)
		}
	}
	links, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	fds, _ := filepath.Glob("/proc/self/fd/*")
	for _, p := range append(links, fds...) {
		if target, _ := os.Readlink(p); target == netns {
			// The kernel gives a freed namespace's inode number to the next one made: a
			// process that started after the teardown (another test's, another daemon's)
			// cannot hold this lease's.
			pid := filepath.Base(filepath.Dir(filepath.Dir(p)))
			if started, ok := startTicks(pid); ok && started > tornDown {
				continue
			}
			t.Errorf("%s still holds the lease's network namespace", p)
		}
	}
	if _, err := s.Usage(l.ID); err == nil {
		t.Error("Usage after Teardown: want ErrUnknownLease")
	}
}

// Sweep, in a new daemon run, removes a lease cgroup the state does not know.
func TestSweepRemovesOrphans(t *testing.T) {
	s := newTestSandbox(t)
	parent := testCgroupParent + "/sweep-" + strconv.Itoa(os.Getpid())
	old, err := New(Config{CgroupParent: parent, HelperPath: goHelperPath(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { confine.RemoveEmptyParent(parent) })
	kept := newTestLease(t, old, nil)
	orphan := newTestLease(t, old, nil)
	cmd, tr, err := old.Command(orphan.ID, Spec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()
	_ = s
	old.settle() // the orphan's launcher is made: it is one of the pids to sweep

	want := []int{cmd.Process.Pid}
	if l, ok := old.eng.Launcher(orphan.ID); ok {
		// The launcher made for the orphan's next command, once in its cgroup (on v1 it
		// joins it itself).
		waitFor(t, "the launcher in its cgroup", func() bool {
			pids, _ := old.cg.ChildPids(orphan.ID, l.Cgroup)
			return slices.Contains(pids, l.PID)
		})
		want = append(want, l.PID)
	}

	restarted, err := New(Config{CgroupParent: parent, HelperPath: goHelperPath(t)})
	if err != nil {
		t.Fatal(err)
	}
	ids, pids, err := restarted.Sweep(context.Background(), func(id string) bool { return id == kept.ID })
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(pids)
	slices.Sort(want)
	if len(ids) != 1 || ids[0] != orphan.ID || !slices.Equal(pids, want) {
		t.Errorf("Sweep = %v, %v; want [%s], %v", ids, pids, orphan.ID, want)
	}
	if _, err := os.Stat(cgroupDir(old, "memory", orphan.ID)); !os.IsNotExist(err) {
		t.Errorf("orphan cgroup still there")
	}
	if _, err := os.Stat(cgroupDir(old, "memory", kept.ID)); err != nil {
		t.Errorf("known lease's cgroup removed: %v", err)
	}
}
