package sandbox

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startLeftover runs script to completion (it prints the pid of what it leaves behind,
// redirected away from the pipe) and closes its tree, and returns that pid and the
// command's child cgroup.
func startLeftover(t *testing.T, s *Sandbox, leaseID, script string) (int, string) {
	t.Helper()
	out, tr := runToEnd(t, s, leaseID, script)
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("output %q", out)
	}
	return pid, treeCgroup(tr)
}

// runToEnd starts script through its Tree, as package process does, and waits for it.
func runToEnd(t *testing.T, s *Sandbox, leaseID, script string) (string, Tree) {
	t.Helper()
	cmd, tr, err := s.Command(leaseID, sh(script))
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return out.String(), tr
}

// What a finished command leaves behind stays in its child cgroup, is listed with its
// argv, start time and memory, can be signalled alone (and nothing else can through the
// same call), and its child cgroup goes once it has emptied.
func TestLeftoversStayListedAndSignalled(t *testing.T) {
	s := newTestSandbox(t)
	l := newTestLease(t, s, nil)
	other := newTestLease(t, s, nil)
	before := time.Now()
	pid, child := startLeftover(t, s, l.ID, `sleep 100.61 >/dev/null 2>&1 & echo $!`)
	if !alive(pid) {
		t.Fatalf("leftover %d died with its command", pid)
	}
	if pids, _ := s.cg.ChildPids(l.ID, child); !slices.Contains(pids, pid) {
		t.Fatalf("leftover %d not in its command's cgroup %s: %v", pid, child, pids)
	}
	listed, n, err := s.Leftovers(l.ID)
	if err != nil || n != 1 || len(listed) != 1 {
		t.Fatalf("Leftovers = %+v, %d, %v", listed, n, err)
	}
	got := listed[0]
	if got.PID != pid || !slices.Equal(got.Argv, []string{"sleep", "100.61"}) || got.RSSBytes <= 0 ||
		got.StartedAt.Before(before.Add(-2*time.Second)) || got.StartedAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("leftover %+v, want pid %d, argv sleep 100.61, rss > 0, started about %v", got, pid, before)
	}
	if _, n, _ := s.Leftovers(other.ID); n != 0 {
		t.Fatalf("another lease lists %d leftovers", n)
	}

	// A running command's process is not a leftover, nor is the daemon, nor pid 0.
	cmd, tr, err := s.Command(l.ID, sh(`echo $$; exec sleep 100.62`))
	if err != nil {
		t.Fatal(err)
	}
	stdout, _ := cmd.StdoutPipe()
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32)
	k, _ := stdout.Read(buf)
	running, _ := strconv.Atoi(strings.TrimSpace(string(buf[:k])))
	for _, p := range []int{running, os.Getpid(), 0, -1} {
		if err := s.SignalLeftover(l.ID, p, syscall.SIGKILL); !errors.Is(err, ErrNotLeftover) {
			t.Errorf("SignalLeftover(%d): %v, want ErrNotLeftover", p, err)
		}
	}
	if err := s.SignalLeftover(other.ID, pid, syscall.SIGKILL); !errors.Is(err, ErrNotLeftover) {
		t.Errorf("another lease signalled the leftover: %v", err)
	}
	if !alive(pid) || !alive(running) {
		t.Fatalf("refused signals still killed something: leftover %v, running %v", alive(pid), alive(running))
	}
	if err := tr.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	tr.Close()

	if err := s.SignalLeftover(l.ID, pid, syscall.SIGTERM); err != nil {
		t.Fatalf("SignalLeftover: %v", err)
	}
	if err := pollUntil(context.Background(), 10*time.Second, func() (bool, error) { return !alive(pid), nil }); err != nil {
		t.Fatalf("leftover %d alive after SIGTERM", pid)
	}
	// Emptied: a look removes its cgroup (once the leftover is reaped: v2 keeps a cgroup
	// populated by a zombie).
	err = pollUntil(context.Background(), 10*time.Second, func() (bool, error) {
		_, n, err := s.Leftovers(l.ID)
		return n == 0 && !slices.Contains(children(t, s, l.ID), child), err
	})
	if err != nil {
		t.Fatalf("emptied leftover cgroup %s still there: %q (%v)", child, children(t, s, l.ID), err)
	}
	if err := s.SignalLeftover(l.ID, pid, syscall.SIGTERM); !errors.Is(err, ErrNotLeftover) {
		t.Fatalf("signal to a gone leftover: %v", err)
	}
}

// Kill before Close gives the old behaviour: nothing is left. Teardown takes leftovers
// with the lease, and PruneLeftovers removes what emptied on its own.
func TestLeftoversKilledOrTornDown(t *testing.T) {
	s := newTestSandbox(t)
	l := newTestLease(t, s, nil)

	out, tr := runToEnd(t, s, l.ID, `sleep 100.63 >/dev/null 2>&1 & echo $!`)
	killed, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	if err := tr.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if alive(killed) {
		t.Fatalf("Kill then Close left %d", killed)
	}
	if _, n, _ := s.Leftovers(l.ID); n != 0 {
		t.Fatalf("%d leftovers after Kill", n)
	}

	short, shortChild := startLeftover(t, s, l.ID, `sleep 0.2 >/dev/null 2>&1 & echo $!`)
	if err := pollUntil(context.Background(), 10*time.Second, func() (bool, error) { return !alive(short), nil }); err != nil {
		t.Fatal(err)
	}
	err := pollUntil(context.Background(), 10*time.Second, func() (bool, error) {
		s.PruneLeftovers()
		s.settle()
		return !slices.Contains(children(t, s, l.ID), shortChild), nil
	})
	if err != nil {
		t.Fatalf("PruneLeftovers left the emptied %s: %v", shortChild, err)
	}

	pid, _ := startLeftover(t, s, l.ID, `(setsid sleep 100.64 >/dev/null 2>&1 &); sleep 100.65 >/dev/null 2>&1 & echo $!`)
	if _, n, _ := s.Leftovers(l.ID); n != 2 {
		t.Fatalf("%d leftovers, want the setsid'd sleep and the other", n)
	}
	if err := s.Teardown(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Retire(context.Background(), l.ID); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Fatalf("leftover %d outlived Teardown and Retire", pid)
	}
	for _, dir := range cgroupDirs(s, l.ID) {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("lease cgroup %s still there (%v)", dir, err)
		}
	}
}
