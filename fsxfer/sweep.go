package fsxfer

import (
	"context"
	"strings"
)

// SweepTemps removes what writes interrupted by a crash left in the workdir: the
// temporary files of WriteFile and the staging directories of ExtractTar (both named
// with tempPrefix beside their target). A running daemon removes its own on failure;
// only a kill -9 or a power cut leaves them, so the daemon calls this when it restores a
// lease at start, before any process of the lease runs again. It never follows a symlink
// or crosses a mount point, and returns how many entries it removed.
func (f *FS) SweepTemps(ctx context.Context) (int, error) {
	d, err := f.openDir(".")
	if err != nil {
		return 0, err
	}
	defer d.Close()
	id, err := identify(fd(d))
	if err != nil {
		return 0, err
	}
	removed := 0
	err = walk(ctx, fd(d), id.mnt, "", 0, func(e walkEntry) (bool, error) {
		if !strings.HasPrefix(e.name, tempPrefix) {
			return true, nil
		}
		if e.mount {
			return false, nil // never touch a mount point, whatever its name
		}
		if err := removeAt(e.dirfd, e.name); err != nil {
			return false, err
		}
		removed++
		return false, nil
	})
	return removed, err
}
