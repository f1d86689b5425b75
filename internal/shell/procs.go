package shell

import (
	"log/slog"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// descendants returns the pids below root (the daemon sees every lease process: there is
// no pid namespace), from the kernel's children lists, or a scan of every process's parent
// on a kernel without them. A process that left the tree (double fork, reparented to the
// daemon as subreaper) is not one; a command's escalation does not reach it, and neither
// should it: it is a background job in all but name.
func descendants(root int) map[int]bool {
	if _, err := os.Stat(childrenFile(root, root)); err != nil {
		return descendantsByScan(root)
	}
	out := map[int]bool{}
	queue := []int{root}
	for len(queue) > 0 && len(out) < maxDescendants {
		p := queue[0]
		queue = queue[1:]
		tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(p) + "/task")
		for _, task := range tasks {
			tid, err := strconv.Atoi(task.Name())
			if err != nil {
				continue
			}
			b, _ := os.ReadFile(childrenFile(p, tid))
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil && !out[c] {
					out[c] = true
					queue = append(queue, c)
				}
			}
		}
	}
	return out
}

// maxDescendants bounds a walk (a lease's pids limit is far below).
const maxDescendants = 1 << 16

func childrenFile(pid, tid int) string {
	return "/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(tid) + "/children"
}

func descendantsByScan(root int) map[int]bool {
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
	for len(queue) > 0 && len(out) < maxDescendants {
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
