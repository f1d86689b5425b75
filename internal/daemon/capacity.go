package daemon

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// capacityMemory is the memory leases may commit in all, for GET /v1/info's capacity:
// the configured figure, else the host's MemTotal (0 when /proc/meminfo cannot say).
// In a container the host's figure overstates the pod's: the chart sets
// SIDECAR_CAPACITY_MEMORY_BYTES from the pod's memory limit.
func capacityMemory(configured int64) int64 {
	if configured > 0 {
		return configured
	}
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0
		}
		return kb << 10
	}
	return 0
}
