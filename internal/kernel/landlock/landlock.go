// Package landlock confines the calling thread with raw Landlock system calls: the one
// implementation behind the Go sandbox helper (package initproc) and the script workers
// (package script); cmd/sidecar-init/sidecar-init.c is its C twin. A Landlock domain
// belongs to the thread's credentials and execve keeps exactly the calling thread, so
// restricting one locked thread right before an exec confines the new image fully while
// the caller's other threads are never touched. (go-landlock would restrict every thread
// through libpsx, which is not in go.sum.) It imports nothing beyond x/sys, so that the
// helper stays fast to start.
package landlock

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Rights granted by rules.
const (
	Read    = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	Execute = unix.LANDLOCK_ACCESS_FS_EXECUTE
	// File is what the kernel accepts in a rule on a non-directory.
	File = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
		unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE |
		unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	Device = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
		unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	MakeDevices = unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK
	// TCP is the network rights of ABI 4; handling them with no rule denies all TCP.
	TCP = unix.LANDLOCK_ACCESS_NET_BIND_TCP | unix.LANDLOCK_ACCESS_NET_CONNECT_TCP
)

// Rule grants Access (masked to what the ABI handles) beneath Path.
type Rule struct {
	Path   string
	Access uint64
}

// rulesetAttr is struct landlock_ruleset_attr as of ABI 6; older kernels accept this size
// while the fields they do not know are zero.
type rulesetAttr struct {
	handledFS  uint64
	handledNet uint64
	scoped     uint64
}

type pathBeneathAttr struct {
	allowed  uint64
	parentFD int32
}

// ABI is the kernel's Landlock ABI, 0 when Landlock is unavailable.
func ABI() int {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// HandledFS is every filesystem right the given ABI knows (up to ABI 7; RESOLVE_UNIX and
// later rights are left to a newer build), so anything no rule grants is denied.
func HandledFS(abi int) uint64 {
	var fs uint64 = 1<<13 - 1 // EXECUTE .. MAKE_SYM
	if abi >= 2 {
		fs |= unix.LANDLOCK_ACCESS_FS_REFER
	}
	if abi >= 3 {
		fs |= unix.LANDLOCK_ACCESS_FS_TRUNCATE
	}
	if abi >= 5 {
		fs |= unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	}
	return fs
}

// Restrict confines the calling thread (and what it execs) under ABI abi (0: nothing to
// do): every filesystem right is handled and only rules grant them; net rights are
// handled from ABI 4 (no rule grants them). From ABI 6 signals and abstract unix sockets
// are scoped to the domain: no signal to the daemon or another lease, whatever the uids.
// A rule's path that does not exist, or that the caller may not reach, gets no rule: it
// stays denied. The caller has set no_new_privs.
func Restrict(abi int, net uint64, rules []Rule) error {
	if abi == 0 {
		return nil
	}
	fs := HandledFS(abi)
	attr := rulesetAttr{handledFS: fs}
	if abi >= 4 {
		attr.handledNet = net
	}
	if abi >= 6 {
		attr.scoped = unix.LANDLOCK_SCOPE_SIGNAL | unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
	}
	rfd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return fmt.Errorf("landlock_create_ruleset: %w", errno)
	}
	defer unix.Close(int(rfd))
	for _, r := range rules {
		if err := addRule(int(rfd), r.Path, r.Access&fs); err != nil {
			return fmt.Errorf("landlock rule %s: %w", r.Path, err)
		}
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, rfd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", errno)
	}
	return nil
}

func addRule(rulesetFD int, path string, access uint64) error {
	if path == "" {
		return nil
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EACCES) {
		return nil // e.g. /lib64 on a host without it
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
		access &= File // the kernel refuses directory rights on a file
	}
	rule := pathBeneathAttr{allowed: access, parentFD: int32(fd)}
	if _, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rulesetFD), unix.LANDLOCK_RULE_PATH_BENEATH,
		uintptr(unsafe.Pointer(&rule)), 0, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
