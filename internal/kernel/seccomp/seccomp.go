// Package seccomp is the system-call filter of every lease process and script worker: a
// denylist, modelled on the default profile of Docker (github.com/moby/profiles/seccomp),
// of the calls a sandboxed program never needs and that reach kernel surface a lease must
// not touch: new namespaces (user namespaces above all, the entry point of many kernel
// privilege escalations), mounts, keyrings, BPF, perf, module loading, raw and packet
// sockets, and the like.
//
// Why a denylist, when moby ships an allowlist: the lease runs arbitrary toolchains
// (compilers, interpreters, git, node), and an allowlist that misses one new system call
// breaks them in ways that are hard to diagnose, while everything a denylist leaves open is
// still behind the lease's own uid, no_new_privs, Landlock and cgroups. The cost: a system
// call newer than this list is allowed; denied here is what an unprivileged process could
// otherwise use, or could use once a user namespace handed it capabilities.
//
// The filter is assembled here only: the daemon hands the program to both helpers (the C
// one, cmd/sidecar-init/sidecar-init.c, included) in their config, and each loads it as
// it is; the sandbox tests run every check against both helpers. Foreign architectures
// (i386 through int 0x80, x32) kill the process: a filter keyed on x86_64 numbers would
// otherwise be bypassed by them.
package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Denied are the system calls refused with EPERM whatever their arguments, by name (the
// kernel's syscall table). Names this architecture lacks are skipped. Left open on
// purpose, as moby does: ptrace and process_vm_readv/writev (debuggers and strace work;
// Landlock already confines ptrace to the lease's own processes), adjtimex and
// clock_adjtime (read-only use; setting the clock needs CAP_SYS_TIME, which nothing here
// can gain).
var Denied = []string{
	// namespaces and mounts
	"setns", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "open_tree_attr",
	"fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
	// keyrings
	"keyctl", "add_key", "request_key",
	// kernel extension, tracing and the host's state
	"bpf", "perf_event_open", "userfaultfd", "kexec_load", "kexec_file_load",
	"init_module", "finit_module", "delete_module", "create_module", "get_kernel_syms", "query_module",
	"iopl", "ioperm", "swapon", "swapoff", "reboot", "acct", "settimeofday", "clock_settime",
	"quotactl", "quotactl_fd", "lookup_dcookie", "nfsservctl", "vm86", "uselib", "_sysctl", "sysfs",
	"ustat", "syslog", "vhangup", "sethostname", "setdomainname", "fanotify_init", "open_by_handle_at",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"lsm_get_self_attr", "lsm_set_self_attr", "lsm_list_modules",
	// cross-process calls moby grants only with CAP_SYS_PTRACE
	"kcmp", "pidfd_getfd", "process_madvise",
	// NUMA placement (moby: CAP_SYS_NICE)
	"get_mempolicy", "set_mempolicy", "set_mempolicy_home_node", "mbind", "migrate_pages", "move_pages",
}

// Conditional rules, the same in both helpers; only the low 32 bits of an argument are
// compared, as the kernel reads these arguments as int (a caller could set the high bits).
const (
	// NamespaceFlags are the CLONE_NEW* flags clone may not carry: clone's low byte is the
	// exit signal, so CLONE_NEWTIME (0x80) is only checked for unshare (clone cannot use it).
	NamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
		unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET
	UnshareFlags = NamespaceFlags | unix.CLONE_NEWTIME
	// SockTypeMask selects the socket type from socket(2)'s type argument.
	SockTypeMask = 0xf
)

// SocketFamilies are the only socket families a lease may open (raw and packet types of
// the inet ones, and netfilter netlink, are refused besides): local, IPv4, IPv6 and
// netlink, which ip, ss and libc's interface queries use. The rest reach kernel code a
// sandbox has no use for: vsock (on a VM host, the hypervisor), packet, bluetooth, the
// crypto API, CAN, RDS, TIPC, X.25 and the like (Docker's default profile refuses
// AF_VSOCK too).
var SocketFamilies = []uint32{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// Personalities are the only personality(2) arguments allowed (moby's): PER_LINUX,
// PER_LINUX32, each with UNAME26, and the query 0xffffffff. The others turn off address
// randomisation or make data executable.
var Personalities = []uint32{0, 8, 0x20000, 0x20008, 0xffffffff}

// Refusals in the filter.
const (
	retAllow = unix.SECCOMP_RET_ALLOW
	retEPERM = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	// clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc fall back to
	// clone, whose flags it can.
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	retKill   = unix.SECCOMP_RET_KILL_PROCESS
)

// Install confines the calling thread and everything it executes from now on with
// Program. The caller has set no_new_privs and locked the OS thread (a filter is per
// thread; the exec that follows from this thread carries it into the target).
func Install() error {
	prog, err := Program()
	if err != nil {
		return err
	}
	return Load(prog)
}

// Load installs prog (a Program the daemon compiled and handed to a helper) as Install
// does.
func Load(prog []unix.SockFilter) error {
	if len(prog) == 0 || len(prog) > unix.BPF_MAXINSNS {
		return fmt.Errorf("seccomp: a program of %d instructions", len(prog))
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return fmt.Errorf("seccomp: %w", errno)
	}
	return nil
}

// Available says whether the kernel can install this filter (CONFIG_SECCOMP_FILTER and
// the kill-process action, Linux 4.14).
func Available() bool {
	action := uint32(retKill)
	_, _, errno := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, uintptr(unsafe.Pointer(&action)))
	return errno == 0 && archOK
}

var errArch = errors.New("seccomp: no filter for this architecture (" + runtime.GOARCH + ")")

// Program is the classic-BPF filter, assembled once per process: the daemon hands it to
// every helper, which loads it as it is. Callers must not modify it.
var Program = sync.OnceValues(assemble)

func assemble() ([]unix.SockFilter, error) {
	if !archOK {
		return nil, errArch
	}
	var a asm
	// Foreign architecture (on x86_64: the i386 entry through int 0x80) or the x32 ABI
	// (the x86_64 architecture with bit 30 set in the number): kill.
	a.ld(offArch)
	a.jeq(nativeArch, "native", "")
	a.ret(retKill)
	a.label("native")
	a.ld(offNR)
	if x32Bit != 0 {
		a.jge(x32Bit, "kill", "")
	}
	for _, name := range Denied {
		if nr, ok := syscalls[name]; ok {
			a.jeq(nr, "eperm", "")
		}
	}
	a.jeq(unix.SYS_CLONE3, "enosys", "")
	a.jeq(unix.SYS_CLONE, "clone", "")
	a.jeq(unix.SYS_UNSHARE, "unshare", "")
	a.jeq(unix.SYS_SOCKET, "socket", "")
	a.jeq(unix.SYS_PERSONALITY, "personality", "")
	a.ret(retAllow)

	a.label("clone")
	a.ldArg(0)
	a.jset(NamespaceFlags, "eperm", "allow")
	a.label("unshare")
	a.ldArg(0)
	a.jset(UnshareFlags, "eperm", "allow")

	a.label("socket")
	a.ldArg(0)
	a.jeq(unix.AF_UNIX, "allow", "")
	a.jeq(unix.AF_INET, "inet", "")
	a.jeq(unix.AF_INET6, "inet", "")
	a.jeq(unix.AF_NETLINK, "netlink", "eperm")
	a.label("inet")
	a.ldArg(1)
	a.and(SockTypeMask)
	a.jeq(unix.SOCK_RAW, "eperm", "")
	a.jeq(unix.SOCK_PACKET, "eperm", "allow")
	a.label("netlink")
	a.ldArg(2)
	a.jeq(unix.NETLINK_NETFILTER, "eperm", "allow")

	a.label("personality")
	a.ldArg(0)
	for _, p := range Personalities {
		a.jeq(p, "allow", "")
	}
	a.ret(retEPERM)

	a.label("allow")
	a.ret(retAllow)
	a.label("eperm")
	a.ret(retEPERM)
	a.label("enosys")
	a.ret(retENOSYS)
	a.label("kill")
	a.ret(retKill)
	return a.assemble()
}

// Offsets in struct seccomp_data.
const (
	offNR   = 0
	offArch = 4
	offArgs = 16
)

// asm is a classic-BPF assembler with named jump targets: "" means the next instruction.
type asm struct {
	prog   []unix.SockFilter
	jumps  []jump
	labels map[string]int
}

type jump struct {
	at     int
	jt, jf string
}

func (a *asm) ld(off uint32) {
	a.prog = append(a.prog, unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: off})
}

// ldArg loads the low 32 bits of argument i (little-endian: the first word).
func (a *asm) ldArg(i uint32) { a.ld(offArgs + 8*i + argLowWord) }

func (a *asm) and(k uint32) {
	a.prog = append(a.prog, unix.SockFilter{Code: unix.BPF_ALU | unix.BPF_AND | unix.BPF_K, K: k})
}

func (a *asm) ret(k uint32) {
	a.prog = append(a.prog, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: k})
}

func (a *asm) jeq(k uint32, jt, jf string)  { a.jmp(unix.BPF_JEQ, k, jt, jf) }
func (a *asm) jge(k uint32, jt, jf string)  { a.jmp(unix.BPF_JGE, k, jt, jf) }
func (a *asm) jset(k uint32, jt, jf string) { a.jmp(unix.BPF_JSET, k, jt, jf) }

func (a *asm) jmp(op uint16, k uint32, jt, jf string) {
	a.jumps = append(a.jumps, jump{len(a.prog), jt, jf})
	a.prog = append(a.prog, unix.SockFilter{Code: unix.BPF_JMP | op | unix.BPF_K, K: k})
}

func (a *asm) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	a.labels[name] = len(a.prog)
}

// assemble resolves the jumps: forward only, at most 255 instructions (classic BPF).
func (a *asm) assemble() ([]unix.SockFilter, error) {
	offset := func(from int, to string) (uint8, error) {
		if to == "" {
			return 0, nil
		}
		at, ok := a.labels[to]
		if !ok {
			return 0, fmt.Errorf("seccomp: no label %q", to)
		}
		d := at - from - 1
		if d < 0 || d > 255 {
			return 0, fmt.Errorf("seccomp: jump to %q out of range (%d)", to, d)
		}
		return uint8(d), nil
	}
	var err error
	for _, j := range a.jumps {
		in := &a.prog[j.at]
		if in.Jt, err = offset(j.at, j.jt); err != nil {
			return nil, err
		}
		if in.Jf, err = offset(j.at, j.jf); err != nil {
			return nil, err
		}
	}
	if len(a.prog) > unix.BPF_MAXINSNS {
		return nil, errors.New("seccomp: filter too long")
	}
	return a.prog, nil
}
