package initproc

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/kernel/landlock"
)

// appliedABI is the ABI the helper applies: the kernel's, capped at maxABI when set.
func appliedABI(kernel, maxABI int) int {
	if maxABI > 0 && kernel > maxABI {
		return maxABI
	}
	return kernel
}

// restrict confines the helper's locked thread (and the target it execs) to p: the best
// ABI the kernel has (up to p.MaxABI), never less than p.MinABI. Network rights are not
// handled: the lease's network namespace governs them.
func restrict(p *Landlock) error {
	abi := appliedABI(landlock.ABI(), p.MaxABI)
	if abi < p.MinABI {
		return fmt.Errorf("landlock ABI %d, need %d", abi, p.MinABI)
	}
	var rules []landlock.Rule
	for _, g := range []struct {
		paths  []string
		access uint64
	}{
		{p.RW, landlock.HandledFS(abi) &^ landlock.MakeDevices},
		{p.RX, landlock.Read | landlock.Execute},
		{p.RO, landlock.Read},
		{p.Dev, landlock.Device | unix.LANDLOCK_ACCESS_FS_READ_DIR},
	} {
		for _, path := range g.paths {
			rules = append(rules, landlock.Rule{Path: path, Access: g.access})
		}
	}
	return landlock.Restrict(abi, 0, rules)
}
