package confine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// BecomeSubreaper makes the daemon the parent of every orphaned confined process (a
// double-forked daemon, a shell's background job), so that RunReaper can reap them and
// their zombies never pile up against their cell's pids limit.
func BecomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: become child subreaper: %w", err)
	}
	return nil
}

// reapInterval is the least time between two reaping passes. An orphan is reaped by the
// second pass that finds it a zombie, so it holds one of its cell's pids for about two
// passes.
const reapInterval = 50 * time.Millisecond

// RunReaper reaps orphaned zombie children until ctx ends, on SIGCHLD and every second.
//
// It never steals a child that os/exec is waiting for: Go's os.StartProcess holds a pidfd
// for each child it starts, created atomically with the child (CLONE_PIDFD) and closed
// only after Wait. A zombie child for which the daemon holds no pidfd is an orphan that
// was reparented to us, and nobody else will wait for it. Zombies are listed before the
// pidfds are, so a child started in between cannot be mistaken for an orphan.
func RunReaper(ctx context.Context, log *slog.Logger) {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		log.Warn("no pidfd support: orphaned lease processes are not reaped", "err", err)
		return
	}
	unix.Close(fd)
	sigchld := make(chan os.Signal, 1)
	signal.Notify(sigchld, syscall.SIGCHLD)
	defer signal.Stop(sigchld)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var r orphanReaper
	for {
		if n := r.pass(); n > 0 {
			log.Debug("reaped orphaned processes", "count", n)
		}
		// A pass reads the stat of every child (each cell's launcher is one) and the
		// fdinfo of every descriptor: at most one pass per reapInterval, however many
		// children exit meanwhile (SIGCHLDs coalesce in the channel).
		select {
		case <-ctx.Done():
			return
		case <-time.After(reapInterval):
		}
		select {
		case <-ctx.Done():
			return
		case <-sigchld:
		case <-tick.C:
		}
	}
}

// orphanReaper reaps the zombie children no os.Process owns. A child os/exec waits for is
// reaped by its Wait as soon as it exits, so a zombie that is still there a pass later is
// most likely an orphan: only then are the daemon's pidfds listed, which reads the fdinfo
// of every descriptor it holds (nine per lease). Under a stream of commands some child
// has always just exited, and listing them at every pass cost 2% of the machine's CPU
// with 100 leases busy. The pidfds still decide: a zombie os/exec holds one for is never
// reaped here, however long it stays.
type orphanReaper struct {
	last map[int]bool // the zombies of the last pass
}

// pass reaps the zombies that the last pass found too, and returns how many.
func (r *orphanReaper) pass() int {
	zombies := zombieChildren()
	last := r.last
	r.last = make(map[int]bool, len(zombies))
	var aged []int
	for _, pid := range zombies {
		r.last[pid] = true
		if last[pid] {
			aged = append(aged, pid)
		}
	}
	if len(aged) == 0 {
		return 0
	}
	held := heldPidfds()
	n := 0
	for _, pid := range aged {
		if held[pid] {
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err == nil && got == pid {
			n++
			delete(r.last, pid)
		}
	}
	return n
}

// zombieChildren lists the orphans reparented to this process that have exited (and, in
// passing, any other exited child). An orphan goes to the subreaper's first live thread
// (the kernel's find_alive_thread), the thread group leader, which in a Go program lives
// as long as the process: only its children are listed, not every thread's. A pass costs
// one read and a waitid per child (each lease's launcher is one): reading each child's
// /proc stat instead cost ten times more (BenchmarkReapPass: 26 ms a pass with 1,000
// children).
func zombieChildren() []int {
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/children")
	if err != nil {
		return nil
	}
	var pids []int
	for s := range strings.FieldsSeq(string(b)) {
		pid, err := strconv.Atoi(s)
		if err == nil && exited(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// exited says whether the child pid has exited, without reaping it (WNOWAIT): os/exec
// may still be about to wait for it. Linux zeroes info when no child is waitable.
func exited(pid int) bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT|unix.WALL, nil)
	return err == nil && info.Signo == int32(unix.SIGCHLD)
}

// heldPidfds is the set of pids the daemon holds a pidfd for ("Pid:" in fdinfo).
func heldPidfds() map[int]bool {
	held := map[int]bool{}
	entries, _ := os.ReadDir("/proc/self/fdinfo")
	for _, e := range entries {
		b, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Pid:"); ok {
				if pid, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
					held[pid] = true
				}
			}
		}
	}
	return held
}
