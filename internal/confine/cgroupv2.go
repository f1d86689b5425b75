package confine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/kernel/cgroupfs"
)

// cgroupV2 runs under the daemon's own delegated cgroup (systemd Delegate=yes). The
// no-internal-processes rule means a cgroup that hands controllers to children holds no
// processes itself, so the daemon first moves into a leaf, <own>/daemon, and leases go
// under <own>/<parent>.
type cgroupV2 struct {
	base   string // <mount><own>/<parent>
	clone3 bool   // helpers are cloned into their cgroups (clone3Usable)
}

var v2Controllers = []string{"memory", "cpu", "pids"}

func newCgroupV2(parent, mount string, log *slog.Logger) (*cgroupV2, error) {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	leaf, base, err := v2Paths(string(self), mount, parent, hostV2Delegated)
	if err != nil {
		return nil, err
	}
	if leaf != "" {
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("cgroup v2 leaf: %w", err)
		}
		if err := cgroupfs.WriteFile(filepath.Join(leaf, "cgroup.procs"), strconv.Itoa(os.Getpid())); err != nil {
			return nil, fmt.Errorf("cgroup v2: move daemon into its leaf: %w", err)
		}
		log.Info("moved the daemon into its own cgroup leaf", "cgroup", leaf)
	}
	// Every level from the daemon's own cgroup down to base hands the controllers on
	// (base's parent may be the root cgroup, which starts with none enabled, and the
	// parent setting may have several parts).
	top := filepath.Dir(leaf)
	if leaf == "" {
		top = mount
	}
	if err := enableControllers(top); err != nil {
		if errors.Is(err, syscall.EBUSY) { // the no-internal-processes rule
			return nil, fmt.Errorf("cgroup v2: %s holds processes other than the daemon, so it cannot hand controllers to lease cgroups: run the daemon alone in its cgroup (systemd: Delegate=yes) or from the root cgroup: %w", top, err)
		}
		return nil, err
	}
	rel, err := filepath.Rel(top, base)
	if err != nil {
		return nil, fmt.Errorf("cgroup v2: %w", err)
	}
	dir := top
	for part := range strings.SplitSeq(rel, "/") {
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("cgroup v2: %w", err)
		}
		if err := enableControllers(dir); err != nil {
			return nil, err
		}
	}
	c := &cgroupV2{base: base, clone3: clone3Usable()}
	if !c.clone3 {
		log.Info("clone3 is refused (a seccomp filter, such as systemd's for RestrictNamespaces=): helpers join their cgroups by cgroup.procs")
	}
	return c, nil
}

// clone3Usable reports whether this process may call clone3. A seccomp filter may answer
// it with ENOSYS so that libc falls back to clone, whose flags it can inspect: systemd
// (251 and later) does for any unit with RestrictNamespaces=, the shipped one included.
// Go's os/exec has no such fallback for CLONE_INTO_CGROUP, so without clone3 a helper
// joins its cgroup itself, as it does on v1. The probe's arguments are invalid: the
// kernel refuses them (EINVAL) and makes no process.
func clone3Usable() bool {
	_, _, errno := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
	return errno != unix.ENOSYS
}

// enableControllers delegates memory, cpu and pids to dir's children.
func enableControllers(dir string) error {
	avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup v2: %w", err)
	}
	have := strings.Fields(string(avail))
	var want []string
	for _, c := range v2Controllers {
		if !strings.Contains(" "+strings.Join(have, " ")+" ", " "+c+" ") {
			return fmt.Errorf("cgroup v2: controller %s not delegated to %s", c, dir)
		}
		want = append(want, "+"+c)
	}
	return cgroupfs.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(want, " "))
}

func (c *cgroupV2) Version() string { return "v2" }

// Key: a v2 parent is a directory (under a systemd unit's own cgroup, so two units never
// collide).
func (c *cgroupV2) Key() string { return "v2:" + c.base }

func (c *cgroupV2) Dir(_ string, parts ...string) string { return c.dir(parts...) }

func (c *cgroupV2) dir(parts ...string) string {
	return filepath.Join(append([]string{c.base}, parts...)...)
}

func (c *cgroupV2) Provision(id string, l Limits) error {
	d := c.dir(id)
	if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := enableControllers(d); err != nil {
		return err
	}
	if err := setMemoryV2(d, l.MemoryBytes); err != nil {
		return err
	}
	quota := "max"
	if l.CPUMillicores > 0 {
		quota = strconv.FormatInt(l.CPUMillicores*cfsPeriodUS/1000, 10)
	}
	if err := writeIfChanged(filepath.Join(d, "cpu.max"), fmt.Sprintf("%s %d", quota, cfsPeriodUS)); err != nil {
		return err
	}
	return cgroupfs.WriteFile(filepath.Join(d, "pids.max"), limitV2(l.Pids))
}

// limitV2 spells a limit for a v2 control file: "max" for none.
func limitV2(n int64) string {
	if n <= 0 {
		return "max"
	}
	return strconv.FormatInt(n, 10)
}

// setMemoryV2 sets the memory limit of dir and, where swap is accounted, no swap: swap
// is no way around the limit.
func setMemoryV2(dir string, n int64) error {
	if err := cgroupfs.WriteFile(filepath.Join(dir, "memory.max"), limitV2(n)); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, "memory.swap.max")); err == nil {
		return cgroupfs.WriteFile(filepath.Join(dir, "memory.swap.max"), "0")
	}
	return nil
}

func (c *cgroupV2) SetMemory(id, child string, bytes int64) error {
	return setMemoryV2(c.dir(id, child), bytes)
}

func (c *cgroupV2) MemoryDir(id, child string) string { return c.dir(id, child) }

func (c *cgroupV2) NewChild(id, child string) error { return os.Mkdir(c.dir(id, child), 0o755) }

func (c *cgroupV2) JoinFiles(id, child string) []string {
	if c.clone3 {
		return nil
	}
	return []string{c.dir(id, child, "cgroup.procs")}
}

func (c *cgroupV2) ForkJoinFiles(id, child string) []string { return c.JoinFiles(id, child) }

func (c *cgroupV2) ChildDir(id, child string) string {
	if !c.clone3 {
		return ""
	}
	return c.dir(id, child)
}

// KillChild kills a tree's child cgroup. After most commands it is already empty:
// "populated 0" in cgroup.events (no process, not even a zombie, in it) is then read once
// instead of a kill and a wait. Nothing enters an unpopulated child: its processes were
// the only ones that could fork into it.
func (c *cgroupV2) KillChild(ctx context.Context, id, child string) error {
	dir := c.dir(id, child)
	n, err := cgroupfs.ReadKey(filepath.Join(dir, "cgroup.events"), "populated")
	if errors.Is(err, os.ErrNotExist) || err == nil && n == 0 {
		return nil
	}
	_, err = killV2(ctx, dir)
	return err
}

func (c *cgroupV2) ChildOOMKills(id, child string) int64 {
	n, _ := cgroupfs.ReadKey(c.dir(id, child, "memory.events"), "oom_kill")
	return n
}

func (c *cgroupV2) ChildPids(id, child string) ([]int, error) { return cgroupfs.Pids(c.dir(id, child)) }

func (c *cgroupV2) RemoveChild(id, child string) error { return cgroupfs.RemoveTree(c.dir(id, child)) }

func (c *cgroupV2) KillCell(ctx context.Context, id string) ([]int, error) {
	return killV2(ctx, c.dir(id))
}

// StopCell writes cgroup.kill, which kills the whole subtree with no fork escaping it.
func (c *cgroupV2) StopCell(_ context.Context, id string, _ []int) (bool, error) {
	err := cgroupfs.WriteFile(c.dir(id, "cgroup.kill"), "1")
	if errors.Is(err, os.ErrNotExist) {
		_, statErr := os.Stat(c.dir(id))
		return errors.Is(statErr, os.ErrNotExist), nil // the cell is gone, or no cgroup.kill here: KillCell says
	}
	return err == nil, err
}

func (c *cgroupV2) RemoveCell(id string) error { return cgroupfs.RemoveTree(c.dir(id)) }

func (c *cgroupV2) Usage(id string, _ map[string]bool) (Usage, error) {
	var u Usage
	var err error
	if u.MemoryBytes, err = cgroupfs.ReadInt(c.dir(id, "memory.current")); err != nil {
		return u, err
	}
	us, err := cgroupfs.ReadKey(c.dir(id, "cpu.stat"), "usage_usec")
	if err != nil {
		return u, err
	}
	u.CPUSeconds = float64(us) / 1e6
	if u.Pids, err = cgroupfs.ReadInt(c.dir(id, "pids.current")); err != nil {
		return u, err
	}
	u.OOMKills, err = cgroupfs.ReadKey(c.dir(id, "memory.events"), "oom_kill") // hierarchical on v2
	return u, err
}

func (c *cgroupV2) Cells() ([]string, error) { return cgroupfs.Children(c.base) }

// killV2 uses cgroup.kill (Linux 5.14+), which kills the whole subtree atomically, and
// waits for the cgroup to report itself unpopulated.
func killV2(ctx context.Context, dir string) ([]int, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	pids, _ := cgroupfs.Pids(dir)
	if err := cgroupfs.WriteFile(filepath.Join(dir, "cgroup.kill"), "1"); err != nil {
		return nil, err
	}
	err := pollUntil(ctx, KillDeadline, func() (bool, error) {
		n, err := cgroupfs.ReadKey(filepath.Join(dir, "cgroup.events"), "populated")
		return n == 0, err
	})
	if errors.Is(err, syscall.ENOENT) {
		err = nil
	}
	if err != nil {
		return pids, fmt.Errorf("%s: %w: %v", dir, errNotEmpty, err)
	}
	return pids, nil
}
