package lease

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Modes of a lease's directories. Dir is 0711 so the lease uid can reach work/ and tmp/
// (chowned to it by the Provisioner) without listing or writing Dir itself.
const (
	dirMode    fs.FileMode = 0o711
	subdirMode fs.FileMode = 0o700
)

// ensureDirs creates whatever is missing of a lease's directories and sets their modes
// (mkdir's are cut by the umask). It is idempotent, for restarts.
func ensureDirs(l Lease) error {
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{{l.Dir, dirMode}, {l.Workdir(), subdirMode}, {l.TmpDir(), subdirMode}, {l.HomeDir(), subdirMode}, {l.UploadsDir(), subdirMode}} {
		if err := os.Mkdir(d.path, d.mode); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		fi, err := os.Lstat(d.path)
		if err != nil {
			return err
		}
		if !fi.IsDir() { // a symlink or file in its place: never chmod through it
			return fmt.Errorf("%s is not a directory", d.path)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return err
		}
	}
	return nil
}

// dropLease removes what a torn-down lease left: the provisioner's part (Retire), then its
// directory (dropDir).
func (m *Manager) dropLease(ctx context.Context, l Lease) error {
	if p := m.cfg.Provisioner; p != nil {
		if err := p.Retire(context.WithoutCancel(ctx), l); err != nil {
			return err
		}
	}
	return m.dropDir(ctx, l.Dir)
}

// dropDir detaches a lease directory's filesystem and only then removes the directory.
// A failed detach leaves it: RemoveDir refuses a tree that holds a mount point anyway.
func (m *Manager) dropDir(ctx context.Context, dir string) error {
	if d := m.cfg.Disk; d != nil {
		if err := d.Detach(context.WithoutCancel(ctx), dir); err != nil {
			return err
		}
	}
	return m.removeDir(dir)
}

// removeDir removes a lease directory tree; one already gone is not an error.
func (m *Manager) removeDir(dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return m.cfg.RemoveDir(dir)
}
