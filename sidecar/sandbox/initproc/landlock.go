package initproc

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Landlock is applied with raw system calls on the helper's one locked thread, right
// before execve: a Landlock domain belongs to the thread's credentials, and execve keeps
// exactly the calling thread, so the target is fully confined while the daemon never is.
// (go-landlock would restrict every thread through libpsx, which is not in go.sum.)

// rulesetAttr is struct landlock_ruleset_attr as of ABI 6; the kernel accepts this size.
type rulesetAttr struct {
	handledFS  uint64
	handledNet uint64
	scoped     uint64
}

type pathBeneathAttr struct {
	allowed  uint64
	parentFD int32
}

const (
	accessRead    = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	accessExecute = unix.LANDLOCK_ACCESS_FS_EXECUTE
	// accessFile is what the kernel accepts in a rule on a non-directory.
	accessFile = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
		unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE |
		unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	accessDevice = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
		unix.LANDLOCK_ACCESS_FS_TRUNCATE | unix.LANDLOCK_ACCESS_FS_IOCTL_DEV
	accessNoDevices = unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK
)

// ABIVersion is the kernel's Landlock ABI, 0 when Landlock is unavailable.
func ABIVersion() int {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// handledFS is every filesystem right the given ABI knows (up to ABI 7; RESOLVE_UNIX and
// later rights are left to a newer helper), so anything not granted below is denied.
func handledFS(abi int) uint64 {
	var fs uint64 = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_WRITE_FILE |
		unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR |
		unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE |
		unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR |
		unix.LANDLOCK_ACCESS_FS_MAKE_REG | unix.LANDLOCK_ACCESS_FS_MAKE_SOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_SYM
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

// appliedABI is the ABI the helper applies: the kernel's, capped at maxABI when set.
func appliedABI(kernel, maxABI int) int {
	if maxABI > 0 && kernel > maxABI {
		return maxABI
	}
	return kernel
}

// restrict confines the calling thread (and what it execs) to p: the best ABI the kernel
// has (up to p.MaxABI), never less than p.MinABI. The caller has set no_new_privs already.
func restrict(p *Landlock) error {
	abi := appliedABI(ABIVersion(), p.MaxABI)
	if abi < p.MinABI {
		return fmt.Errorf("landlock ABI %d, need %d", abi, p.MinABI)
	}
	if abi == 0 {
		return nil // best effort on a kernel without Landlock
	}
	fs := handledFS(abi)
	attr := rulesetAttr{handledFS: fs}
	if abi >= 6 {
		// Scoping keeps signals and abstract unix sockets inside the lease's own domain:
		// no signal to the daemon or another lease, whatever the uids. Below ABI 6 the
		// lease's own uid (without capabilities) covers signals, and its network namespace
		// (network "none") covers abstract sockets; see docs/operations.md.
		attr.scoped = unix.LANDLOCK_SCOPE_SIGNAL | unix.LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
	}
	rfd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return fmt.Errorf("landlock_create_ruleset: %w", errno)
	}
	defer unix.Close(int(rfd))
	groups := []struct {
		paths  []string
		access uint64
	}{
		{p.RW, fs &^ accessNoDevices},
		{p.RX, accessRead | accessExecute},
		{p.RO, accessRead},
		{p.Dev, accessDevice | unix.LANDLOCK_ACCESS_FS_READ_DIR},
	}
	for _, g := range groups {
		for _, path := range g.paths {
			if err := addRule(int(rfd), path, g.access&fs); err != nil {
				return err
			}
		}
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, rfd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock_restrict_self: %w", errno)
	}
	return nil
}

func addRule(rulesetFD int, path string, access uint64) error {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil // e.g. /lib64 on a host without it
	}
	if err != nil {
		return fmt.Errorf("landlock rule %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("landlock rule %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		access &= accessFile // the kernel refuses directory rights on a file
	}
	rule := pathBeneathAttr{allowed: access, parentFD: int32(fd)}
	if _, _, errno := unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, uintptr(rulesetFD), unix.LANDLOCK_RULE_PATH_BENEATH,
		uintptr(unsafe.Pointer(&rule)), 0, 0, 0); errno != 0 {
		return fmt.Errorf("landlock rule %s: %w", path, errno)
	}
	return nil
}
