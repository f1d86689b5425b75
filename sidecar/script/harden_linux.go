package script

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/sidecar/sandbox/seccomp"
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

// Landlock access rights by ABI version (see landlock(7)).
const (
	llFSv1  = 1<<13 - 1 // EXECUTE .. MAKE_SYM
	llFSv2  = llFSv1 | unix.LANDLOCK_ACCESS_FS_REFER
	llFSv3  = llFSv2 | unix.LANDLOCK_ACCESS_FS_TRUNCATE
	llFSv5  = llFSv3 | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	llNetv4 = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
	llScope = unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | unix.LANDLOCK_SCOPE_SIGNAL

	llRead  = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	llExec  = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE
	llCache = llRead | unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_MAKE_REG |
		unix.LANDLOCK_ACCESS_FS_MAKE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE
)

// landlock confines the calling thread (and what it executes) to: executing the worker
// binary and the dynamic loader's libraries, listing the empty WASI root, and the
// compilation cache. No TCP, no abstract unix sockets, no signals outside the domain.
// It returns the ABI used, 0 when the kernel has no Landlock.
func landlock(exe string, s setup) (int, error) {
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		if errno == unix.ENOSYS || errno == unix.EOPNOTSUPP {
			return 0, nil
		}
		return 0, errno
	}
	attr := unix.LandlockRulesetAttr{Handled_access_fs: llFSv1}
	switch {
	case abi >= 5:
		attr.Handled_access_fs = llFSv5
	case abi >= 3:
		attr.Handled_access_fs = llFSv3
	case abi >= 2:
		attr.Handled_access_fs = llFSv2
	}
	if abi >= 4 {
		attr.Handled_access_net = llNetv4
	}
	size := unsafe.Offsetof(attr.Scoped)
	if abi >= 6 {
		attr.Scoped = llScope
		size = unsafe.Offsetof(attr.Quiet_access_fs)
	}
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if errno != 0 {
		return 0, fmt.Errorf("create ruleset: %w", errno)
	}
	defer unix.Close(int(fd))
	rules := []struct {
		path   string
		access uint64
	}{
		{exe, llExec},
		{s.Root, unix.LANDLOCK_ACCESS_FS_READ_DIR},
		{s.CacheDir, llCache},
		// A cgo-linked binary needs its loader and libc after the exec.
		{"/etc/ld.so.cache", unix.LANDLOCK_ACCESS_FS_READ_FILE},
		{"/lib", llRead | llExec}, {"/lib64", llRead | llExec},
		{"/usr/lib", llRead | llExec}, {"/usr/lib64", llRead | llExec},
	}
	for _, r := range rules {
		if r.path == "" {
			continue
		}
		if err := addPathRule(int(fd), r.path, r.access&attr.Handled_access_fs); err != nil {
			return 0, fmt.Errorf("rule for %s: %w", r.path, err)
		}
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return 0, fmt.Errorf("restrict self: %w", errno)
	}
	return int(abi), nil
}

// fileRights are the rights that make sense on a non-directory.
const fileRights = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
	unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV

func addPathRule(rulesetFD int, path string, access uint64) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) {
		// No /lib64 on this distribution, or a cache the worker uid cannot reach
		// anyway: no rule needed.
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		access &= fileRights
	}
	attr := unix.LandlockPathBeneathAttr{Allowed_access: access, Parent_fd: int32(fd)}
	_, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rulesetFD), unix.LANDLOCK_RULE_PATH_BENEATH,
		uintptr(unsafe.Pointer(&attr)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
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
