package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/kernel/cgroupfs"
)

// cgroupDriver is one cgroup version's way of doing the same few things. Child cgroups
// (one per started command) live under the lease's: limits stay at the lease level and
// apply hierarchically, while a child can be killed and asked about OOM kills on its own.
type cgroupDriver interface {
	version() string
	provision(id string, l LeaseSpec) error
	newChild(id, child string) error
	// setMemory sets the memory limit of a child cgroup, or of id itself when child is "".
	setMemory(id, child string, bytes int64) error
	// memoryDir is the cgroup's directory in the memory hierarchy.
	memoryDir(id, child string) string
	// joinFiles are the cgroup.procs files the helper writes its pid to (v1).
	joinFiles(id, child string) []string
	// childDir is the directory to clone into (v2 CLONE_INTO_CGROUP), "" on v1.
	childDir(id, child string) string
	killChild(ctx context.Context, id, child string) error
	childOOMKills(id, child string) int64
	// childPids lists the processes in a child cgroup (leftovers.go).
	childPids(id, child string) ([]int, error)
	removeChild(id, child string) error
	killLease(ctx context.Context, id string) ([]int, error)
	removeLease(id string) error
	// usage skips the child cgroups in counted (their OOM kills are already tallied).
	usage(id string, counted map[string]bool) (Usage, error)
	leases() ([]string, error)
}

// Bounds on killing a cgroup: a cgroup that will not empty (a process stuck in the
// kernel) is reported rather than waited for forever.
const (
	killRounds   = 50
	killDeadline = 10 * time.Second
	cfsPeriodUS  = 100000
)

var errNotEmpty = errors.New("cgroup did not empty")

func newCgroupDriver(parent string, log *slog.Logger) (cgroupDriver, error) {
	switch cgroupfs.Version() {
	case 1:
		return newCgroupV1(parent, "/proc/self/mountinfo")
	case 2:
		return newCgroupV2(parent, cgroupfs.Root, log)
	default:
		return nil, errors.New("no cgroup filesystem mounted")
	}
}

// readPids lists cgroup.procs of dir and all its descendants.
func readPids(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		for f := range strings.FieldsSeq(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids, err
}

func listDirs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, err
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
