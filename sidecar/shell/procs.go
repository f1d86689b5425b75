package shell

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// descendants returns the pids below root, from /proc (the daemon sees every lease
// process: there is no pid namespace). A process that left the tree (double fork,
// reparented to a subreaper) is not one; a command's escalation does not reach it, and
// neither should it: it is a background job in all but name.
func descendants(root int) map[int]bool {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
	}
	out := map[int]bool{}
	queue := []int{root}
	for len(queue) > 0 && len(out) < 1<<16 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			if !out[c] {
				out[c] = true
				queue = append(queue, c)
			}
		}
	}
	return out
}

// parentOf reads a process's parent from /proc/PID/stat (after the command name, which
// may hold spaces and parentheses: hence the last ')').
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}

// killNew SIGKILLs the descendants of root that are not in before: what the interrupted
// command started. Each is opened as a pidfd and checked again to still be below root
// before the signal, so a pid recycled since the scan is never hit.
func killNew(root int, before map[int]bool, logger *slog.Logger) {
	now := descendants(root)
	for pid := range now {
		if before[pid] {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone already
		}
		if ppid, ok := parentOf(pid); ok && (ppid == root || now[ppid]) {
			if err := unix.PidfdSendSignal(fd, syscall.SIGKILL, nil, 0); err != nil && err != syscall.ESRCH {
				logger.Warn("killing an interrupted command's process", "pid", pid, "err", err)
			}
		}
		unix.Close(fd)
	}
}
