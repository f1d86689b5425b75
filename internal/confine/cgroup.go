package confine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/kernel/cgroupfs"
)

// Cgroups is the daemon's cgroup parent, driven the way this host's cgroup version wants
// (v1: a directory per hierarchy; v2: one tree). Under the parent each cell (a lease, the
// script workers) has a cgroup, id, that holds the limits, and child cgroups, one per
// started command or worker: limits stay at the cell level and apply hierarchically, while
// a child can be killed and asked about OOM kills on its own.
type Cgroups interface {
	Version() string // "v1" or "v2"
	// Key names the parent host-wide: two daemons must never share one (see package
	// sandbox's owner lock).
	Key() string
	// Provision makes the cell's cgroup, or adopts one left by an earlier run, with limits.
	Provision(id string, l Limits) error
	NewChild(id, child string) error
	// SetMemory sets the memory limit of a child cgroup, or of id itself when child is "".
	SetMemory(id, child string, bytes int64) error
	// MemoryDir is the cgroup's directory in the memory hierarchy.
	MemoryDir(id, child string) string
	// Dir is the directory of the cgroup at parts (cell id, child) in the hierarchy of
	// controller ctrl (one per controller on v1, one for all on v2).
	Dir(ctrl string, parts ...string) string
	// JoinFiles are the cgroup.procs files a helper from outside the cell writes its pid
	// to: one per v1 hierarchy, the child's on v2 where clone3 is refused; none where
	// ChildDir is set.
	JoinFiles(id, child string) []string
	// ForkJoinFiles are those of JoinFiles a process forked inside the cell (by its
	// zygote) still writes: on v1, only the hierarchies where a cell has children.
	ForkJoinFiles(id, child string) []string
	// ChildDir is the directory to clone into (v2 CLONE_INTO_CGROUP), "" on v1 and where
	// clone3 is refused.
	ChildDir(id, child string) string
	KillChild(ctx context.Context, id, child string) error
	ChildOOMKills(id, child string) int64
	// ChildPids lists the processes in a child cgroup.
	ChildPids(id, child string) ([]int, error)
	RemoveChild(id, child string) error
	// KillCell kills every process in the cell's subtree, waits until the subtree is
	// empty and returns their pids.
	KillCell(ctx context.Context, id string) ([]int, error)
	// StopCell sends every process in the cell's subtree SIGKILL where none can fork
	// first, without waiting for them to exit; false if it could not be sure of that (a
	// task stuck in the kernel kept a v1 cell from freezing), when KillCell must follow.
	// ours are the engine's own processes of the cell, killed already: they fork nothing
	// unasked, so a cell that holds nothing else needs no freezing.
	StopCell(ctx context.Context, id string, ours []int) (bool, error)
	RemoveCell(id string) error
	// Usage skips the child cgroups in counted (their OOM kills are already tallied).
	Usage(id string, counted map[string]bool) (Usage, error)
	// Cells lists the cgroups under the parent: the leases' and the cells'.
	Cells() ([]string, error)
}

// Limits are a cell's limits; 0 means none.
type Limits struct {
	MemoryBytes, CPUMillicores, Pids int64
}

// Usage is a cell's resource use so far.
type Usage struct {
	MemoryBytes int64
	CPUSeconds  float64
	Pids        int64
	OOMKills    int64
}

// Bounds on killing a cgroup: a cgroup that will not empty (a process stuck in the
// kernel) is reported rather than waited for forever.
const (
	killRounds = 50
	// KillDeadline bounds how long a kill waits for a cgroup to empty.
	KillDeadline = 10 * time.Second
	cfsPeriodUS  = 100000
)

var errNotEmpty = errors.New("cgroup did not empty")

// OpenCgroups makes (or finds) the cgroup parent, a relative path such as "sidecar", on
// this host's cgroup version: <hierarchy>/<parent> on v1; on v2 under the daemon's own
// delegated cgroup, or /sys/fs/cgroup/<parent> when started by hand (cgroupv2paths.go).
func OpenCgroups(parent string, log *slog.Logger) (Cgroups, error) {
	if !ValidParent(parent) {
		return nil, fmt.Errorf("%w: cgroup parent %q", ErrInvalid, parent)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch cgroupfs.Version() {
	case 1:
		return newCgroupV1(parent, "/proc/self/mountinfo")
	case 2:
		return newCgroupV2(parent, cgroupfs.Root, log)
	default:
		return nil, errors.New("no cgroup filesystem mounted")
	}
}

// namePattern is what a part of the parent may be; lease ids are of the same form.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`)

// ValidParent says whether p is a cgroup parent OpenCgroups takes: relative, clean, its
// parts names that start with a letter or digit.
func ValidParent(p string) bool {
	if p == "" || filepath.IsAbs(p) || !filepath.IsLocal(p) {
		return false
	}
	for part := range strings.SplitSeq(p, "/") {
		if !namePattern.MatchString(part) {
			return false
		}
	}
	return true
}

// RemoveEmptyParent removes the cgroup parent if it is empty, on either version (tests).
func RemoveEmptyParent(parent string) {
	for _, ctrl := range v1Controllers {
		syscall.Rmdir(filepath.Join(cgroupfs.Root, ctrl, parent))
	}
	if self, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		if _, base, err := v2Paths(string(self), cgroupfs.Root, parent, hostV2Delegated); err == nil {
			syscall.Rmdir(base)
		}
	}
}

// pollUntil calls done with a growing interval until it reports true, the deadline passes
// or ctx ends.
func pollUntil(ctx context.Context, timeout time.Duration, done func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	interval := 50 * time.Microsecond
	for {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return context.DeadlineExceeded
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		interval = min(interval*2, 10*time.Millisecond)
	}
}

// writeIfChanged writes value to a control file unless it holds it already: setting a CPU
// quota or period walks every cpu cgroup on the host, so a new cgroup's defaults are not
// written again.
func writeIfChanged(path, value string) error {
	if b, err := cgroupfs.ReadFile(path); err == nil && strings.TrimSpace(string(b)) == value {
		return nil
	}
	return cgroupfs.WriteFile(path, value)
}
