package script

import (
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// hardenSelf gives the whole worker process no_new_privs. prctl applies to one thread,
// so the worker sets it on its locked thread and re-executes itself: the new image
// inherits the flag on every thread it will ever have.
func hardenSelf() error {
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("get no_new_privs: %w", err)
	}
	if nnp == 1 {
		return nil
	}
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	err = syscall.Exec("/proc/self/exe", os.Args, os.Environ())
	return fmt.Errorf("re-exec with no_new_privs: %w", err)
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
