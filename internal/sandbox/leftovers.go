package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A command's leftovers are the processes still in its child cgroup once its main process
// has exited and its Tree is closed: `server &` from a shell that then returns, a
// double-forked daemon. They stay in that child cgroup, inside the lease's, so the
// lease's memory, cpu and pids limits still bind them; Teardown (release, expiry, the
// restart of the daemon) kills them with the rest of the lease. A child cgroup that has
// emptied is removed by PruneLeftovers, which Leftovers and every Tree.Close of the lease
// call too.
//
// Without cgroups nothing could find them again (a setsid'd process leaves the process
// group), so Tree.Close kills the process group as it always did.

// MaxLeftoversListed bounds how many leftovers Leftovers describes (the count is exact).
const MaxLeftoversListed = 256

// maxCmdline bounds the bytes of /proc/<pid>/cmdline read for a leftover's argv.
const maxCmdline = 4096

// ErrNotLeftover: the pid is not (or no longer) a leftover process of the lease.
var ErrNotLeftover = errors.New("sandbox: no such leftover process")

// Leftover is one process a finished command left in its lease. PID is the same inside
// the lease as on the host: lease processes share the host's pid namespace (only their
// /proc is private, and shows the lease's own processes).
type Leftover struct {
	PID       int
	Argv      []string // from /proc/<pid>/cmdline, cut at 4 KiB
	StartedAt time.Time
	RSSBytes  int64
}

// Leftovers lists the leftover processes of a lease, oldest pid first: the first
// MaxLeftoversListed of them, and how many there are in all. Zombies (exited, not yet
// reaped) are not counted. Child cgroups found empty are removed on the way.
func (s *Sandbox) Leftovers(leaseID string) (listed []Leftover, count int, err error) {
	pids, err := s.leftoverPids(leaseID)
	if err != nil {
		return nil, 0, err
	}
	slices.Sort(pids)
	boot := bootTime()
	for _, pid := range pids {
		l, ok := describe(pid, boot)
		if !ok {
			continue
		}
		count++
		if len(listed) < MaxLeftoversListed {
			listed = append(listed, l)
		}
	}
	return listed, count, nil
}

// leftoverPids prunes the lease's emptied leftover cgroups and returns the pids of the
// others.
func (s *Sandbox) leftoverPids(leaseID string) ([]int, error) {
	s.mu.Lock()
	le := s.leases[leaseID]
	s.mu.Unlock()
	if le == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownLease, leaseID)
	}
	if s.cg == nil {
		return nil, nil
	}
	return s.eng.LeftoverPids(leaseID), nil
}

// SignalLeftover delivers sig to one leftover process of the lease, and to nothing else:
// the pid is opened as a pidfd first, then looked up in the lease's leftover cgroups, and
// the signal goes through the pidfd. Were the pid recycled between the two steps, the
// pidfd would name the process that exited and the signal would reach nobody; the
// lease's uid cannot move a process between cgroups. ErrNotLeftover otherwise.
func (s *Sandbox) SignalLeftover(leaseID string, pid int, sig syscall.Signal) error {
	if pid <= 0 {
		return fmt.Errorf("%w: %d", ErrNotLeftover, pid)
	}
	s.mu.Lock()
	known := s.leases[leaseID] != nil
	s.mu.Unlock()
	if !known {
		return fmt.Errorf("%w: %s", ErrUnknownLease, leaseID)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("%w: %d", ErrNotLeftover, pid)
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%w: signalling one leftover needs pidfds (Linux 5.3)", ErrUnsupported)
	case err != nil:
		return fmt.Errorf("sandbox: pidfd of %d: %w", pid, err)
	}
	defer unix.Close(fd)
	pids, err := s.leftoverPids(leaseID)
	if err != nil {
		return err
	}
	if !slices.Contains(pids, pid) {
		return fmt.Errorf("%w: %d", ErrNotLeftover, pid)
	}
	if err := unix.PidfdSendSignal(fd, sig, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("%w: %d (it exited)", ErrNotLeftover, pid)
		}
		return fmt.Errorf("sandbox: signal %d: %w", pid, err)
	}
	return nil
}

// PruneLeftovers removes the emptied leftover cgroups of every lease. The daemon calls it
// from its periodic reaper, so a long lease does not pile up empty cgroups.
func (s *Sandbox) PruneLeftovers() {
	if s.cg != nil {
		s.eng.PruneLeftovers("")
	}
}

// describe reads a leftover's argv, start time and resident memory from /proc; ok is
// false for a pid gone or a zombie.
func describe(pid int, boot time.Time) (Leftover, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return Leftover{}, false
	}
	i := bytes.LastIndex(stat, []byte(") ")) // comm may contain spaces and parentheses
	if i < 0 {
		return Leftover{}, false
	}
	f := strings.Fields(string(stat[i+2:])) // field 3 (state) onwards
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return Leftover{}, false
	}
	l := Leftover{PID: pid}
	if ticks, err := strconv.ParseInt(f[19], 10, 64); err == nil && !boot.IsZero() {
		l.StartedAt = boot.Add(time.Duration(ticks) * time.Second / clockTicks).UTC()
	}
	if statm, err := os.ReadFile(dir + "/statm"); err == nil {
		if sf := strings.Fields(string(statm)); len(sf) > 1 {
			pages, _ := strconv.ParseInt(sf[1], 10, 64)
			l.RSSBytes = pages * int64(os.Getpagesize())
		}
	}
	if fh, err := os.Open(dir + "/cmdline"); err == nil {
		b := make([]byte, maxCmdline)
		n, _ := fh.Read(b)
		fh.Close()
		for a := range bytes.SplitSeq(bytes.TrimRight(b[:n], "\x00"), []byte{0}) {
			l.Argv = append(l.Argv, string(a))
		}
	}
	if l.Argv == nil {
		l.Argv = []string{}
	}
	return l, true
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's start time: 100 on every Linux
// architecture sidecar runs on (sysconf(_SC_CLK_TCK)).
const clockTicks = 100

// bootTime is the kernel's boot time (btime in /proc/stat), zero if unreadable.
func bootTime() time.Time {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if sec, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(sec, 0)
			}
		}
	}
	return time.Time{}
}
