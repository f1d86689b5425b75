package confine

import (
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkReapPass is one reaping pass (what each SIGCHLD costs the daemon, at most one
// per reapInterval) with 0, 100 and 1,000 live children, as with that many leases held
// (each lease's launcher is a child of the daemon), and no zombie.
func BenchmarkReapPass(b *testing.B) {
	var kids []*exec.Cmd
	b.Cleanup(func() {
		for _, c := range kids {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	})
	for _, n := range []int{0, 100, 1000} {
		for len(kids) < n {
			c := exec.Command("sleep", "600")
			if err := c.Start(); err != nil {
				b.Fatal(err)
			}
			kids = append(kids, c)
		}
		b.Run(fmt.Sprintf("children-%d", n), func(b *testing.B) {
			var r orphanReaper
			for b.Loop() {
				if got := r.pass(); got != 0 {
					b.Fatalf("reaped %d of our own children", got)
				}
			}
		})
	}
}

// Orphans left by children of any thread are reaped; a child os/exec started and has not
// yet waited for is not, even once it has exited.
func TestReapOrphansNotExecChildren(t *testing.T) {
	if err := BecomeSubreaper(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) })
	held := exec.Command("true")
	if err := held.Start(); err != nil {
		t.Fatal(err)
	}
	orphans := make([]int, 8)
	var wg sync.WaitGroup
	for i := range orphans {
		wg.Go(func() {
			// Each shell starts from a thread of its own; its background sleep outlives
			// it and is reparented to this process.
			runtime.LockOSThread()
			out, err := exec.Command("sh", "-c", "sleep 0.2 & echo $!").Output()
			if err != nil {
				t.Error(err)
				return
			}
			orphans[i], _ = strconv.Atoi(strings.TrimSpace(string(out)))
		})
	}
	wg.Wait()
	reaped := 0
	var r orphanReaper
	deadline := time.Now().Add(20 * time.Second)
	for reaped < len(orphans) && time.Now().Before(deadline) {
		reaped += r.pass()
		time.Sleep(20 * time.Millisecond)
	}
	if reaped != len(orphans) {
		t.Fatalf("reaped %d of %d orphans", reaped, len(orphans))
	}
	for _, pid := range orphans {
		if err := unix.Kill(pid, 0); err == nil {
			t.Errorf("orphan %d is still there", pid)
		}
	}
	if err := held.Wait(); err != nil {
		t.Fatalf("the exec child's Wait: %v (reaped by the reaper?)", err)
	}
}
