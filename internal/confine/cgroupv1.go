package confine

import (
	"github.com/sidecar-sandbox/sidecar/internal/kernel/cgroupfs"

	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// v1Controllers are the hierarchies a lease process joins: limits (memory, cpu, pids),
// accounting (cpuacct) and killing without races (freezer).
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids", "freezer"}

// v1ChildControllers are the hierarchies where a cell has child cgroups: memory (a
// command's own limit and OOM count) and freezer (killing one command's tree). In the
// others a command stays in its cell's cgroup, which limits and accounts it the same way:
// a child there would cost a mkdir, an rmdir and a migration per command, and the kernel
// walks every cpu cgroup whenever any CPU quota is set.
var v1ChildControllers = []string{"memory", "freezer"}

type cgroupV1 struct {
	mounts     map[string]string // controller → mount point
	hiers      []string          // distinct mount points (cpu and cpuacct are often one)
	childHiers []string          // those of v1ChildControllers
	parent     string
}

func newCgroupV1(parent, mountinfo string) (*cgroupV1, error) {
	b, err := os.ReadFile(mountinfo)
	if err != nil {
		return nil, err
	}
	mounts := parseV1Mounts(string(b))
	c := &cgroupV1{mounts: map[string]string{}, parent: parent}
	var missing []string
	for _, ctrl := range v1Controllers {
		m, ok := mounts[ctrl]
		if !ok {
			missing = append(missing, ctrl)
			continue
		}
		c.mounts[ctrl] = m
		if !slices.Contains(c.hiers, m) {
			c.hiers = append(c.hiers, m)
		}
		if slices.Contains(v1ChildControllers, ctrl) && !slices.Contains(c.childHiers, m) {
			c.childHiers = append(c.childHiers, m)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("cgroup v1 controllers not mounted: %s", strings.Join(missing, ", "))
	}
	for _, h := range c.hiers {
		if err := os.MkdirAll(filepath.Join(h, parent), 0o755); err != nil {
			return nil, fmt.Errorf("cgroup v1: %w", err)
		}
	}
	return c, nil
}

// parseV1Mounts maps each v1 controller to its mount point from /proc/self/mountinfo.
func parseV1Mounts(mountinfo string) map[string]string {
	mounts := map[string]string{}
	for line := range strings.SplitSeq(mountinfo, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 || qf[0] != "cgroup" {
			continue
		}
		for opt := range strings.SplitSeq(qf[2], ",") {
			if slices.Contains(v1Controllers, opt) {
				if _, dup := mounts[opt]; !dup {
					mounts[opt] = pf[4]
				}
			}
		}
	}
	return mounts
}

func (c *cgroupV1) Version() string { return "v1" }

// Key: v1 parents are the same path in every hierarchy.
func (c *cgroupV1) Key() string { return "v1:" + c.parent }

func (c *cgroupV1) Dir(ctrl string, parts ...string) string {
	return filepath.Join(append([]string{c.mounts[ctrl], c.parent}, parts...)...)
}

// dirs is the cgroup at parts in each hierarchy of hiers.
func (c *cgroupV1) dirs(hiers []string, parts ...string) []string {
	ds := make([]string, len(hiers))
	for i, h := range hiers {
		ds[i] = filepath.Join(append([]string{h, c.parent}, parts...)...)
	}
	return ds
}

func (c *cgroupV1) Provision(id string, l Limits) error {
	for _, d := range c.dirs(c.hiers, id) {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	if err := setMemoryV1(c.Dir("memory", id), l.MemoryBytes); err != nil {
		return err
	}
	quota := "-1"
	if l.CPUMillicores > 0 {
		quota = strconv.FormatInt(l.CPUMillicores*cfsPeriodUS/1000, 10)
	}
	if err := writeIfChanged(c.Dir("cpu", id, "cpu.cfs_period_us"), strconv.Itoa(cfsPeriodUS)); err != nil {
		return err
	}
	if err := writeIfChanged(c.Dir("cpu", id, "cpu.cfs_quota_us"), quota); err != nil {
		return err
	}
	pids := "max"
	if l.Pids > 0 {
		pids = strconv.FormatInt(l.Pids, 10)
	}
	return cgroupfs.WriteFile(c.Dir("pids", id, "pids.max"), pids)
}

// setMemoryV1 sets the memory limit and, where swap accounting exists, the memory+swap
// limit to the same value so that swap is no way around it. The kernel wants
// memsw >= mem at every step, so the order depends on the direction.
func setMemoryV1(dir string, n int64) error {
	v := "-1"
	if n > 0 {
		v = strconv.FormatInt(n, 10)
	}
	mem, memsw := filepath.Join(dir, "memory.limit_in_bytes"), filepath.Join(dir, "memory.memsw.limit_in_bytes")
	if _, err := os.Stat(memsw); err != nil {
		return cgroupfs.WriteFile(mem, v)
	}
	if err := cgroupfs.WriteFile(mem, v); err != nil {
		if err := cgroupfs.WriteFile(memsw, v); err != nil {
			return err
		}
		return cgroupfs.WriteFile(mem, v)
	}
	return cgroupfs.WriteFile(memsw, v)
}

func (c *cgroupV1) NewChild(id, child string) error {
	made := 0
	for _, d := range c.dirs(c.childHiers, id, child) {
		if err := os.Mkdir(d, 0o755); err != nil {
			for _, u := range c.dirs(c.childHiers, id, child)[:made] {
				syscall.Rmdir(u)
			}
			return err
		}
		made++
	}
	return nil
}

func (c *cgroupV1) SetMemory(id, child string, bytes int64) error {
	return setMemoryV1(c.MemoryDir(id, child), bytes)
}

func (c *cgroupV1) MemoryDir(id, child string) string { return c.Dir("memory", id, child) }

func (c *cgroupV1) JoinFiles(id, child string) []string {
	ds := make([]string, len(c.hiers))
	for i, h := range c.hiers {
		ds[i] = filepath.Join(c.parent, id)
		if slices.Contains(c.childHiers, h) {
			ds[i] = filepath.Join(ds[i], child)
		}
		ds[i] = filepath.Join(h, ds[i], "cgroup.procs")
	}
	return ds
}

func (c *cgroupV1) ForkJoinFiles(id, child string) []string {
	ds := c.dirs(c.childHiers, id, child)
	for i := range ds {
		ds[i] = filepath.Join(ds[i], "cgroup.procs")
	}
	return ds
}

func (c *cgroupV1) ChildDir(string, string) string { return "" }

func (c *cgroupV1) KillChild(ctx context.Context, id, child string) error {
	_, err := killFrozenV1(ctx, c.Dir("freezer", id, child))
	return err
}

func (c *cgroupV1) ChildOOMKills(id, child string) int64 {
	n, _ := cgroupfs.ReadKey(c.Dir("memory", id, child, "memory.oom_control"), "oom_kill")
	return n
}

func (c *cgroupV1) ChildPids(id, child string) ([]int, error) {
	return cgroupfs.Pids(c.Dir("freezer", id, child)) // every hierarchy has the same members
}

func (c *cgroupV1) RemoveChild(id, child string) error {
	var errs []error
	for _, d := range c.dirs(c.childHiers, id, child) {
		errs = append(errs, cgroupfs.RemoveTree(d))
	}
	return errors.Join(errs...)
}

func (c *cgroupV1) KillCell(ctx context.Context, id string) ([]int, error) {
	return killFrozenV1(ctx, c.Dir("freezer", id))
}

func (c *cgroupV1) StopCell(ctx context.Context, id string, ours []int) (bool, error) {
	return stopFrozenV1(ctx, c.Dir("freezer", id), ours)
}

func (c *cgroupV1) RemoveCell(id string) error {
	var errs []error
	for _, d := range c.dirs(c.hiers, id) {
		errs = append(errs, cgroupfs.RemoveTree(d))
	}
	return errors.Join(errs...)
}

func (c *cgroupV1) Usage(id string, counted map[string]bool) (Usage, error) {
	var u Usage
	var err error
	if u.MemoryBytes, err = cgroupfs.ReadInt(c.Dir("memory", id, "memory.usage_in_bytes")); err != nil {
		return u, err
	}
	ns, err := cgroupfs.ReadInt(c.Dir("cpuacct", id, "cpuacct.usage"))
	if err != nil {
		return u, err
	}
	u.CPUSeconds = float64(ns) / 1e9
	if u.Pids, err = cgroupfs.ReadInt(c.Dir("pids", id, "pids.current")); err != nil {
		return u, err
	}
	// v1 counts OOM kills in the victim's own cgroup only (no propagation to parents), so
	// the lease's count is the sum over its live cgroups: its own and its children's (one
	// level: the lease's uid cannot make cgroups); removed children are added by the
	// caller. A child removed meanwhile (in the background) counts nothing.
	root := c.Dir("memory", id)
	u.OOMKills, _ = cgroupfs.ReadKey(filepath.Join(root, "memory.oom_control"), "oom_kill")
	children, err := cgroupfs.Children(root)
	for _, name := range children {
		if !counted[name] { // being removed: its kills are in the lease's tally
			n, _ := cgroupfs.ReadKey(filepath.Join(root, name, "memory.oom_control"), "oom_kill")
			u.OOMKills += n
		}
	}
	return u, err
}

func (c *cgroupV1) Cells() ([]string, error) {
	var ids []string
	for _, h := range c.hiers {
		names, err := cgroupfs.Children(filepath.Join(h, c.parent))
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if !slices.Contains(ids, n) {
				ids = append(ids, n)
			}
		}
	}
	return ids, nil
}

// killFrozenV1 empties a freezer cgroup subtree: rounds of freezeKill, each followed by a
// wait for the subtree to empty, until it does.
//
// An empty subtree is left alone, which skips three cgroupfs writes after every command
// that ended cleanly: only a member can fork into it. (A helper still joining is not a
// member yet; tree.Kill SIGKILLs it first, so it cannot fork once it is.)
func killFrozenV1(ctx context.Context, dir string) ([]int, error) {
	if pids, err := cgroupfs.Pids(dir); err == nil && len(pids) == 0 {
		return nil, nil // empty, or already gone
	}
	var killed []int
	for range killRounds {
		_, listed, k, err := freezeKill(ctx, dir)
		killed = append(killed, k...)
		if err != nil || listed == 0 {
			return killed, err
		}
		err = pollUntil(ctx, KillDeadline/killRounds, func() (bool, error) {
			pids, err := cgroupfs.Pids(dir)
			return len(pids) == 0, err
		})
		if err == nil {
			return killed, nil
		}
		if ctx.Err() != nil {
			return killed, ctx.Err()
		}
	}
	return killed, fmt.Errorf("%s: %w", dir, errNotEmpty)
}

// stopFrozenV1 is one freezeKill without the wait for the exits: once the cgroup is
// FROZEN none of its tasks can fork, and a frozen task woken with SIGKILL pending exits
// before it runs another instruction of its own. False if it did not freeze within a
// round's share of KillDeadline (KillCell's rounds take over). A cgroup that holds only
// ours (killed already) is not frozen: freezing a launcher or zygote waiting for its next
// request takes 10-20 ms.
func stopFrozenV1(ctx context.Context, dir string, ours []int) (bool, error) {
	pids, err := cgroupfs.Pids(dir)
	if err == nil && !slices.ContainsFunc(pids, func(pid int) bool { return !slices.Contains(ours, pid) }) {
		return true, nil // empty, already gone, or only ours
	}
	frozen, _, _, err := freezeKill(ctx, dir)
	return frozen && err == nil, err
}

// freezeKill is one round of a v1 kill: freeze the subtree (so nothing forks while we
// look), SIGKILL every task in it, thaw (frozen tasks die only once thawed). A task stuck
// in the kernel may keep the cgroup FREEZING past a round's share of KillDeadline: what
// is seen is killed anyway, and frozen says so. listed is how many tasks it held, killed
// those signalled.
func freezeKill(ctx context.Context, dir string) (frozen bool, listed int, killed []int, err error) {
	state := filepath.Join(dir, "freezer.state")
	if err := cgroupfs.WriteFile(state, "FROZEN"); err != nil {
		return false, 0, nil, err
	}
	frozen = pollUntil(ctx, KillDeadline/killRounds, func() (bool, error) {
		b, err := cgroupfs.ReadFile(state)
		return strings.TrimSpace(string(b)) == "FROZEN", err
	}) == nil
	pids, err := cgroupfs.Pids(dir)
	if err != nil {
		cgroupfs.WriteFile(state, "THAWED")
		return frozen, 0, nil, err
	}
	for _, pid := range pids {
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			killed = append(killed, pid)
		}
	}
	return frozen, len(pids), killed, cgroupfs.WriteFile(state, "THAWED")
}
