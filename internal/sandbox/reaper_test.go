package sandbox

import (
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The reaper (running for the whole test binary, see TestMain) reaps orphans but never a
// child os/exec waits for: every Wait below must see its own exit status.
func TestReaperNeverStealsExecChildren(t *testing.T) {
	s := newTestSandbox(t)
	l := newTestLease(t, s, nil)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			err := exec.Command("/bin/sh", "-c", "exit "+strconv.Itoa(i%3)).Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Errorf("Run: %v (a stolen child?)", err)
				return
			}
			if code != i%3 {
				t.Errorf("exit code %d, want %d", code, i%3)
			}
		})
	}
	// Meanwhile a lease leaves orphans behind, which only the reaper collects.
	r := run(t, s, l.ID, sh(`for i in 1 2 3 4 5; do (true &) ; done; sleep 0.01 & echo $!`))
	orphan, _ := strconv.Atoi(strings.TrimSpace(r.stdout))
	wg.Wait()
	waitFor(t, "the orphan to be reaped", func() bool { return !alive(orphan) && !isZombie(orphan) })
	waitFor(t, "the lease's pids to drop to 0", func() bool {
		u, _ := s.Usage(l.ID)
		return u.Pids == 0
	})
}

// isZombie says whether pid has exited and waits to be reaped.
func isZombie(pid int) bool {
	f := procStat(strconv.Itoa(pid))
	return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}
