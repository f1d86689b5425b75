package script

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	ll "github.com/sidecar-sandbox/sidecar/internal/kernel/landlock"
	"github.com/sidecar-sandbox/sidecar/internal/kernel/seccomp"
)

// setupEnv carries the setup frame from a worker's first stage to its second.
const setupEnv = "SIDECAR_SCRIPT_SETUP"

// startWorker returns the worker's setup. A worker starts twice: the first stage reads
// the setup frame, gives its thread no_new_privs, a Landlock domain and the seccomp filter,
// and re-executes itself; prctl and landlock_restrict_self apply to one thread, and an exec from that
// thread makes them hold for every thread of the new image. The second stage finds the
// setup in its (otherwise empty) environment.
func startWorker() (setup, error) {
	var s setup
	if v, ok := os.LookupEnv(setupEnv); ok {
		os.Unsetenv(setupEnv)
		return s, json.Unmarshal([]byte(v), &s)
	}
	// Unbuffered: the second stage reads the jobs that follow on the same stdin.
	if err := readFrame(os.Stdin, 1<<16, &s); err != nil {
		return s, fmt.Errorf("read setup: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return s, err
	}
	if s.DataLimit > 0 { // rlimits are per process: this holds for every thread
		lim := uint64(s.DataLimit)
		if err := unix.Setrlimit(unix.RLIMIT_DATA, &unix.Rlimit{Cur: lim, Max: lim}); err != nil {
			return s, fmt.Errorf("RLIMIT_DATA: %w", err)
		}
	}
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return s, fmt.Errorf("set no_new_privs: %w", err)
	}
	s.Landlock, err = landlock(exe, s)
	if err != nil {
		return s, fmt.Errorf("landlock: %w", err)
	}
	// Nothing the daemon inherited (a descriptor its own parent leaked without
	// close-on-exec) may reach the second stage: it keeps stdin, stdout and stderr only.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return s, fmt.Errorf("close_range: %w", err)
	}
	// The lease processes' filter, on this thread, carried into the second stage by the exec.
	if s.Seccomp {
		if err := seccomp.Install(); err != nil {
			return s, err
		}
	}
	b, err := json.Marshal(s)
	if err != nil {
		return s, err
	}
	err = syscall.Exec(exe, os.Args, []string{setupEnv + "=" + string(b)})
	return s, fmt.Errorf("re-exec: %w", err)
}

// landlock confines the calling thread (and what it executes) to: executing the worker
// binary and the dynamic loader's libraries, listing the empty WASI root, and the
// compilation cache. No TCP, no abstract unix sockets, no signals outside the domain.
// It returns the ABI used, 0 when the kernel has no Landlock.
func landlock(exe string, s setup) (int, error) {
	const (
		exec  = ll.Execute | unix.LANDLOCK_ACCESS_FS_READ_FILE
		cache = ll.Read | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_MAKE_REG |
			unix.LANDLOCK_ACCESS_FS_MAKE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE
	)
	abi := ll.ABI()
	return abi, ll.Restrict(abi, ll.TCP, []ll.Rule{
		{Path: exe, Access: exec},
		{Path: s.Root, Access: unix.LANDLOCK_ACCESS_FS_READ_DIR},
		{Path: s.CacheDir, Access: cache},
		// A cgo-linked binary needs its loader and libc after the exec.
		{Path: "/etc/ld.so.cache", Access: unix.LANDLOCK_ACCESS_FS_READ_FILE},
		{Path: "/lib", Access: ll.Read | exec}, {Path: "/lib64", Access: ll.Read | exec},
		{Path: "/usr/lib", Access: ll.Read | exec}, {Path: "/usr/lib64", Access: ll.Read | exec},
	})
}

// protocolStdout returns a private descriptor for the protocol and points fd 1 at fd 2.
func protocolStdout() (*os.File, error) {
	fd, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, fmt.Errorf("dup stdout: %w", err)
	}
	if err := unix.Dup3(2, 1, 0); err != nil {
		return nil, fmt.Errorf("redirect stdout: %w", err)
	}
	return os.NewFile(uintptr(fd), "protocol"), nil
}
