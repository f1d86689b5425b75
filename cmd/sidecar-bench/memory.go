package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// treeMemory is the memory of a process and all its descendants (the daemon, its script
// workers, each lease's zygote and launcher, lease processes): the sum of their resident
// sets, which counts a page shared by several (the binaries' text) once for each, and of
// their proportional sets, which splits it among them, so that the sum is what the host
// gives the tree.
type treeMemory struct {
	procs        int
	rssKB, pssKB int64
}

func (m treeMemory) String() string {
	return fmt.Sprintf("%.1f MB resident, %.1f MB proportional in %d processes",
		float64(m.rssKB)*1.024/1e3, float64(m.pssKB)*1.024/1e3, m.procs)
}

// readTreeMemory reads treeMemory for root from /proc; processes that exit meanwhile are
// left out.
func readTreeMemory(root int) treeMemory {
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command (which may hold spaces): state, then ppid.
		f := strings.Fields(string(stat)[strings.LastIndexByte(string(stat), ')')+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(f[1]); err == nil {
			children[ppid] = append(children[ppid], pid)
		}
	}
	var m treeMemory
	for queue := []int{root}; len(queue) > 0; queue = queue[1:] {
		pid := queue[0]
		queue = append(queue, children[pid]...)
		rollup, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue
		}
		m.procs++
		for line := range strings.SplitSeq(string(rollup), "\n") {
			k, v, _ := strings.Cut(line, ":")
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			switch k {
			case "Rss":
				m.rssKB += n
			case "Pss":
				m.pssKB += n
			}
		}
	}
	return m
}
