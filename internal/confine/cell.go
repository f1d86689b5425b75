package confine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/sidecar-sandbox/sidecar/internal/kernel/cgroupfs"
)

// cellPrefix starts the name of every named cell's cgroup. No lease id starts with it, so
// a sweep of orphan leases never takes a cell for one (IsCell).
const cellPrefix = "_"

var cellNamePattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// Cell is a named cgroup under the daemon's cgroup parent, beside the leases', for
// processes that are the daemon's own helpers rather than a lease's: the script workers.
// It is made by the same cgroup code as a lease's (v1 or v2): one memory limit for the whole cell,
// and a child cgroup per process with a memory limit of its own, which the kernel
// enforces by killing that process.
type Cell struct {
	cg Cgroups
	id string // the cell's cgroup under the parent: cellPrefix + name
}

// NewCell makes the cell name (lowercase letters, digits and dashes) under the cgroup
// parent (DefaultParent when "") with no limit yet. A cell of that name left by an earlier
// run of the daemon, which owns the parent, is killed and removed first. It needs root and
// cgroups with the memory, cpu and pids controllers, as strict isolation does.
func NewCell(parent, name string, log *slog.Logger) (*Cell, error) {
	if parent == "" {
		parent = DefaultParent
	}
	if !ValidParent(parent) {
		return nil, fmt.Errorf("%w: cgroup parent %q", ErrInvalid, parent)
	}
	if !cellNamePattern.MatchString(name) {
		return nil, fmt.Errorf("%w: cell name %q", ErrInvalid, name)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: cgroups need root", ErrUnsupported)
	}
	cg, err := OpenCgroups(parent, log)
	if err != nil {
		return nil, fmt.Errorf("%w: cgroups: %v", ErrUnsupported, err)
	}
	c := &Cell{cg: cg, id: cellPrefix + name}
	if err := c.Remove(context.Background()); err != nil {
		return nil, fmt.Errorf("confine: cell %s of an earlier run: %w", name, err)
	}
	if err := cg.Provision(c.id, Limits{}); err != nil {
		_ = cg.RemoveCell(c.id)
		return nil, fmt.Errorf("confine: cell %s: %w", name, err)
	}
	return c, nil
}

// SetMemory limits the memory (and, where the kernel accounts it, swap) of the whole
// cell; 0 lifts the limit.
func (c *Cell) SetMemory(bytes int64) error { return c.cg.SetMemory(c.id, "", bytes) }

// NewChild makes the child cgroup child (a name of NewCell's form) with the given
// memory limit.
func (c *Cell) NewChild(child string, memoryBytes int64) error {
	if !cellNamePattern.MatchString(child) {
		return fmt.Errorf("%w: child cgroup name %q", ErrInvalid, child)
	}
	if err := c.cg.NewChild(c.id, child); err != nil {
		return err
	}
	if err := c.SetChildMemory(child, memoryBytes); err != nil {
		_ = c.cg.RemoveChild(c.id, child)
		return err
	}
	return nil
}

// SetChildMemory changes a child's memory limit. Lowering it below what the child
// holds fails on v1 and makes the kernel reclaim, then kill, on v2.
func (c *Cell) SetChildMemory(child string, bytes int64) error {
	return c.cg.SetMemory(c.id, child, bytes)
}

// Join moves the process pid into child, in every hierarchy.
func (c *Cell) Join(child string, pid int) error {
	files := c.cg.JoinFiles(c.id, child)
	if d := c.cg.ChildDir(c.id, child); d != "" {
		files = []string{filepath.Join(d, "cgroup.procs")}
	}
	for _, f := range files {
		if err := cgroupfs.WriteFile(f, strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// ChildDir is the child's directory in the memory hierarchy (for inspection).
func (c *Cell) ChildDir(child string) string { return c.cg.MemoryDir(c.id, child) }

// OOMKills is how many processes the kernel killed in child for its memory limit.
func (c *Cell) OOMKills(child string) int64 { return c.cg.ChildOOMKills(c.id, child) }

// RemoveChild kills whatever is left in child and removes it.
func (c *Cell) RemoveChild(ctx context.Context, child string) error {
	if err := c.cg.KillChild(ctx, c.id, child); err != nil {
		return err
	}
	return c.cg.RemoveChild(c.id, child)
}

// Remove kills every process in the cell and removes it with its children.
func (c *Cell) Remove(ctx context.Context) error {
	if _, err := c.cg.KillCell(ctx, c.id); err != nil {
		return err
	}
	return c.cg.RemoveCell(c.id)
}

// IsCell says whether a cgroup under the parent is a named cell's rather than a lease's.
func IsCell(name string) bool { return len(name) > 0 && name[:1] == cellPrefix }
