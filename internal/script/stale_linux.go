package script

import (
	"errors"
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

var staleDir = regexp.MustCompile(`^sidecar-script-(?:root|cache)-(\d+)-\d+$`)

// CleanupStale removes the temporary WASI roots and compilation caches
// "sidecar-script-{root,cache}-<pid>-*" in tmpDir (os.TempDir() when empty) that the
// Runners of dead daemons left when they were killed before Close. It touches only names
// whose pid no longer runs, and returns what it removed. (The workers' cgroups are in a
// cell under the daemon's own cgroup parent, which the next daemon's confine.NewCell
// clears.)
func CleanupStale(tmpDir string) ([]string, error) {
	if tmpDir == "" {
		tmpDir = os.TempDir()
	}
	entries, err := os.ReadDir(tmpDir)
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
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
