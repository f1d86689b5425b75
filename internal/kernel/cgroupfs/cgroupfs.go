// Package cgroupfs is the one place cgroup control files are written and read: the lease
// cgroups of package sandbox and the script workers' memory cgroups both go through it.
//
// It drives cgroupfs directly rather than through containerd/cgroups' managers: their v1
// package needs modules (protobuf, runtime-spec) this module does not carry, a lease
// process joins its cgroup in the helper (v1) or by clone3 (v2), never through a manager,
// and what the daemon writes is a handful of files (limits, cgroup.procs, cgroup.kill)
// and reads a few counters. The one thing that module was used for, telling v1 from v2,
// is Version below.
package cgroupfs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Root is where the cgroup filesystems are mounted.
const Root = "/sys/fs/cgroup"

// Version is the cgroup version whose controllers the host uses: 2 when Root is a
// cgroup2 mount (unified), 1 for v1 and hybrid hosts (whose cgroup2 mount, if any,
// holds no controllers), 0 when nothing is mounted there.
func Version() int {
	var st unix.Statfs_t
	if err := unix.Statfs(Root, &st); err != nil {
		return 0
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return 2
	}
	return 1
}

// Control files are read and written with bare system calls: through package os, kernfs
// files (which can be polled) are set non-blocking and added to and removed from the
// runtime's poller, eight system calls for a read of a few bytes instead of three, on
// the path of every command.

// WriteFile writes a control file (which must already exist). A write the kernel
// interrupted is made again: v1's memory limits refuse with EINTR whenever a signal is
// pending, and the daemon gets many (SIGCHLD from every helper, the runtime's SIGURG).
func WriteFile(path, value string) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_TRUNC|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	n, err := unix.Write(fd, []byte(value))
	for err == unix.EINTR {
		n, err = unix.Write(fd, []byte(value))
	}
	if err == nil && n != len(value) {
		err = io.ErrShortWrite
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s=%q: %w", path, value, err)
	}
	return nil
}

// ReadFile reads a control file whole.
func ReadFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	b := make([]byte, 0, 512)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		case n == 0:
			return b, nil
		}
		b = b[:len(b)+n]
	}
}

// ReadInt reads a control file holding one number.
func ReadInt(path string) (int64, error) {
	b, err := ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// ReadKey reads "key value" lines (memory.events, memory.oom_control, cpu.stat).
func ReadKey(path, key string) (int64, error) {
	b, err := ReadFile(path)
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

// RemoveTree removes a cgroup directory and its descendants, deepest first; cgroupfs
// directories hold only control files, which rmdir takes with them. A cgroup that still
// has processes stays, with an error. The rmdir is tried first: a command's cgroup has no
// descendants, and listing a cgroup directory (its dozens of control files) cost more
// than the rmdir itself.
func RemoveTree(dir string) error {
	err := syscall.Rmdir(dir)
	if err == nil || errors.Is(err, syscall.ENOENT) {
		return nil
	}
	if !errors.Is(err, syscall.EBUSY) {
		return fmt.Errorf("rmdir %s: %w", dir, err)
	}
	// Busy: child cgroups (removed here, then the rmdir again) or processes (which keep
	// it: the second rmdir says so).
	children, err := Children(dir)
	for _, c := range children {
		if err := RemoveTree(filepath.Join(dir, c)); err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	if err := syscall.Rmdir(dir); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("rmdir %s: %w", dir, err)
	}
	return nil
}

// Pids lists the processes in the cgroup dir and all its descendants (their cgroup.procs);
// none if dir does not exist.
func Pids(dir string) ([]int, error) {
	b, err := ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pids []int
	for f := range strings.FieldsSeq(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	// cgroupfs (kernfs) gives a directory 2 + its subdirectories as its link count: a
	// cgroup without children, as a command's is, is not listed (its dozens of control
	// files cost more to list than its processes to read).
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil || st.Nlink == 2 {
		return pids, nil
	}
	children, err := Children(dir)
	for _, c := range children {
		more, cerr := Pids(filepath.Join(dir, c))
		pids = append(pids, more...)
		err = errors.Join(err, cerr)
	}
	return pids, err
}

// Children lists the child cgroups of dir; none if it does not exist.
func Children(dir string) ([]string, error) {
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
