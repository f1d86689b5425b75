package lease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
)

// Orphans removes the directories under WorkRoot that no lease owns (left by a crash, or by
// a state file restored from an older copy), their filesystems first, and the filesystems
// of unknown leases whose directory is gone, and returns their names. Only names shaped like
// lease ids are considered, so a misconfigured WorkRoot never costs anything we did not make.
func (m *Manager) Orphans(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(m.cfg.WorkRoot)
	if err != nil {
		return nil, fmt.Errorf("lease: orphans: %w", err)
	}
	var removed []string
	var errs []error
	for _, de := range entries {
		name := de.Name()
		// The id is reserved before its directory is made, so a directory we can see
		// whose id is not owned now is not going to become owned.
		if !de.IsDir() || !validID(name) || m.Owns(name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if err := m.dropDir(ctx, filepath.Join(m.cfg.WorkRoot, name)); err != nil {
			errs = append(errs, fmt.Errorf("orphan %s: %w", name, err))
			continue
		}
		m.log.Info("orphan lease directory removed", "lease", name)
		removed = append(removed, name)
	}
	// Filesystems of leases whose directory is already gone (a crash between the two).
	if d := m.cfg.Disk; d != nil {
		swept, err := d.Sweep(ctx, m.Owns)
		errs = append(errs, err)
		for _, id := range swept {
			if !slices.Contains(removed, id) {
				removed = append(removed, id)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// Owns reports whether id belongs to a lease in any state, to one being created, to a
// spare, or to a released one whose directory is being removed: whether what is named
// after id is in use.
func (m *Manager) Owns(id string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.leases[id] != nil || m.retiring[id] != nil || slices.Contains(m.making, id) ||
		slices.ContainsFunc(m.spares, func(l Lease) bool { return l.ID == id }) {
		return true
	}
	for _, c := range m.creating {
		if c.id == id {
			return true
		}
	}
	return false
}
