package script

import (
	"errors"
	"github.com/sidecar-sandbox/sidecar/sidecar/sandbox/cgroupfs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"golang.org/x/sys/unix"
)

// Names that carry the pid of the daemon that made them, so leftovers can be told from
// the live ones.
const (
	rootDirPrefix  = "sidecar-script-root-"
	cacheDirPrefix = "sidecar-script-cache-"
)

var (
	staleCgroup = regexp.MustCompile(`^sidecar-scripts-(\d+)$`)
	staleDir    = regexp.MustCompile(`^sidecar-script-(?:root|cache)-(\d+)-\d+$`)
)

// CleanupStale removes what the Runners of dead daemons left behind when they were
// killed before Close: pool cgroups "sidecar-scripts-<pid>" (and their worker cgroups)
// under cgroupParent in the v1 memory hierarchy, and the temporary WASI roots and
// caches "sidecar-script-{root,cache}-<pid>-*" in tmpDir (os.TempDir() when empty). It
// touches only names whose pid no longer runs, and returns what it removed.
func CleanupStale(cgroupParent, tmpDir string) ([]string, error) {
	if tmpDir == "" {
		tmpDir = os.TempDir()
	}
	var removed []string
	var errs []error
	parent := filepath.Join(memoryRoot, filepath.Clean("/"+cgroupParent))
	if entries, err := os.ReadDir(parent); err == nil {
		for _, e := range entries {
			if m := staleCgroup.FindStringSubmatch(e.Name()); e.IsDir() && m != nil && !alive(m[1]) {
				dir := filepath.Join(parent, e.Name())
				if err := cgroupfs.RemoveTree(dir); err != nil {
					errs = append(errs, err)
					continue
				}
				removed = append(removed, dir)
			}
		}
	}
	entries, err := os.ReadDir(tmpDir)
	if err != nil {
		return removed, errors.Join(append(errs, err)...)
	}
	for _, e := range entries {
		if m := staleDir.FindStringSubmatch(e.Name()); e.IsDir() && m != nil && !alive(m[1]) {
			dir := filepath.Join(tmpDir, e.Name())
			// Roots are empty and caches hold plain files: nothing is ever mounted here.
			if err := os.RemoveAll(dir); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, dir)
		}
	}
	return removed, errors.Join(errs...)
}

func alive(pid string) bool {
	n, err := strconv.Atoi(pid)
	if err != nil || n <= 0 {
		return true // not ours to judge
	}
	err = unix.Kill(n, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
