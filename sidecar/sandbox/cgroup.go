package sandbox

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
	"time"

	"github.com/containerd/cgroups/v3"
)

// cgroupDriver is one cgroup version's way of doing the same few things. Child cgroups
// (one per started command) live under the lease's: limits stay at the lease level and
// apply hierarchically, while a child can be killed and asked about OOM kills on its own.
type cgroupDriver interface {
	version() string
	provision(id string, l LeaseSpec) error
	newChild(id, child string) error
	// joinFiles are the cgroup.procs files the helper writes its pid to (v1).
	joinFiles(id, child string) []string
	// childDir is the directory to clone into (v2 CLONE_INTO_CGROUP), "" on v1.
	childDir(id, child string) string
	killChild(ctx context.Context, id, child string) error
	childOOMKills(id, child string) int64
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
	switch cgroups.Mode() {
	case cgroups.Legacy, cgroups.Hybrid:
		// Hybrid hosts mount the controllers as v1; their cgroup2 mount holds none.
		return newCgroupV1(parent, "/proc/self/mountinfo")
	case cgroups.Unified:
		return newCgroupV2(parent, "/sys/fs/cgroup", log)
	default:
		return nil, errors.New("no cgroup filesystem mounted")
	}
}

// writeFile writes a cgroupfs control file (which must already exist).
func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s=%q: %w", path, value, err)
	}
	return nil
}

func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// readKey reads "key value" lines (memory.events, memory.oom_control, cpu.stat).
func readKey(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no %q", path, key)
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

// removeTree removes a cgroup directory and its descendants, deepest first. cgroupfs
// directories hold only control files, which rmdir takes with them.
func removeTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("rmdir %s: %w", dir, err)
	}
	return nil
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
