package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/moby/sys/mountinfo"
)

// removeTree removes dir unless something is mounted at or below it (a lease's private
// mounts, should the daemon have left one): removing through a mount would delete what
// the mount shows.
func removeTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(abs))
	if err != nil {
		return fmt.Errorf("refusing to remove %s: %w", abs, err)
	}
	if len(ms) > 0 {
		return fmt.Errorf("refusing to remove %s: still mounted: %s", abs, ms[0].Mountpoint)
	}
	return os.RemoveAll(abs)
}
