package script

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sidecar-sandbox/sidecar/sidecar/sandbox/cgroupfs"
)

// memoryRoot is where the cgroup v1 memory hierarchy is mounted.
const memoryRoot = cgroupfs.Root + "/memory"

// memCgroup is one cgroup v1 memory cgroup, driven through package cgroupfs.
type memCgroup struct{ dir string }

// newMemCgroup creates (or reuses) the memory cgroup at rel, below the v1 hierarchy, with
// the given limit. It fails when the host has no v1 memory controller or we are not root.
func newMemCgroup(rel string, limit int64) (*memCgroup, error) {
	if cgroupfs.Version() != 1 {
		return nil, errors.New("no cgroup v1 memory hierarchy (unified mode)")
	}
	if _, err := os.Stat(filepath.Join(memoryRoot, "memory.limit_in_bytes")); err != nil {
		return nil, fmt.Errorf("no cgroup v1 memory controller: %w", err)
	}
	dir := filepath.Join(memoryRoot, filepath.Clean("/"+rel))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	cg := &memCgroup{dir: dir}
	if err := cg.setLimit(limit); err != nil {
		_ = cg.remove(context.Background())
		return nil, err
	}
	return cg, nil
}

func (c *memCgroup) child(name string, limit int64) (*memCgroup, error) {
	rel, err := filepath.Rel(memoryRoot, filepath.Join(c.dir, name))
	if err != nil {
		return nil, err
	}
	return newMemCgroup(rel, limit)
}

func (c *memCgroup) setLimit(limit int64) error {
	return cgroupfs.WriteFile(filepath.Join(c.dir, "memory.limit_in_bytes"), strconv.FormatInt(limit, 10))
}

func (c *memCgroup) addProc(pid int) error {
	return cgroupfs.WriteFile(filepath.Join(c.dir, "cgroup.procs"), strconv.Itoa(pid))
}

// oomKills is how many processes the kernel killed for the limit.
func (c *memCgroup) oomKills() int {
	n, _ := cgroupfs.ReadKey(filepath.Join(c.dir, "memory.oom_control"), "oom_kill")
	return int(n)
}

// remove deletes the cgroup once its last process is gone (the kernel needs a moment
// after SIGKILL before rmdir stops failing with EBUSY).
func (c *memCgroup) remove(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		err := os.Remove(c.dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("remove cgroup %s: %w", c.dir, err)
		case <-tick.C:
		}
	}
}
