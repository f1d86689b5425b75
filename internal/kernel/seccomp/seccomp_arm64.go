package seccomp

import "golang.org/x/sys/unix"

// The filter for arm64: Denied by number (absent here: create_module, get_kernel_syms, query_module, iopl, ioperm, vm86, uselib, _sysctl, sysfs, ustat).
const (
	archOK     = true
	nativeArch = unix.AUDIT_ARCH_AARCH64
	x32Bit     = 0 // no x32 on this architecture
	argLowWord = 0 // little-endian: an argument's low 32 bits come first
)

var syscalls = map[string]uint32{
	"setns":                   unix.SYS_SETNS,
	"mount":                   unix.SYS_MOUNT,
	"umount2":                 unix.SYS_UMOUNT2,
	"pivot_root":              unix.SYS_PIVOT_ROOT,
	"chroot":                  unix.SYS_CHROOT,
	"move_mount":              unix.SYS_MOVE_MOUNT,
	"open_tree":               unix.SYS_OPEN_TREE,
	"open_tree_attr":          unix.SYS_OPEN_TREE_ATTR,
	"fsopen":                  unix.SYS_FSOPEN,
	"fsconfig":                unix.SYS_FSCONFIG,
	"fsmount":                 unix.SYS_FSMOUNT,
	"fspick":                  unix.SYS_FSPICK,
	"mount_setattr":           unix.SYS_MOUNT_SETATTR,
	"keyctl":                  unix.SYS_KEYCTL,
	"add_key":                 unix.SYS_ADD_KEY,
	"request_key":             unix.SYS_REQUEST_KEY,
	"bpf":                     unix.SYS_BPF,
	"perf_event_open":         unix.SYS_PERF_EVENT_OPEN,
	"userfaultfd":             unix.SYS_USERFAULTFD,
	"kexec_load":              unix.SYS_KEXEC_LOAD,
	"kexec_file_load":         unix.SYS_KEXEC_FILE_LOAD,
	"init_module":             unix.SYS_INIT_MODULE,
	"finit_module":            unix.SYS_FINIT_MODULE,
	"delete_module":           unix.SYS_DELETE_MODULE,
	"swapon":                  unix.SYS_SWAPON,
	"swapoff":                 unix.SYS_SWAPOFF,
	"reboot":                  unix.SYS_REBOOT,
	"acct":                    unix.SYS_ACCT,
	"settimeofday":            unix.SYS_SETTIMEOFDAY,
	"clock_settime":           unix.SYS_CLOCK_SETTIME,
	"quotactl":                unix.SYS_QUOTACTL,
	"quotactl_fd":             unix.SYS_QUOTACTL_FD,
	"lookup_dcookie":          unix.SYS_LOOKUP_DCOOKIE,
	"nfsservctl":              unix.SYS_NFSSERVCTL,
	"syslog":                  unix.SYS_SYSLOG,
	"vhangup":                 unix.SYS_VHANGUP,
	"sethostname":             unix.SYS_SETHOSTNAME,
	"setdomainname":           unix.SYS_SETDOMAINNAME,
	"fanotify_init":           unix.SYS_FANOTIFY_INIT,
	"open_by_handle_at":       unix.SYS_OPEN_BY_HANDLE_AT,
	"io_uring_setup":          unix.SYS_IO_URING_SETUP,
	"io_uring_enter":          unix.SYS_IO_URING_ENTER,
	"io_uring_register":       unix.SYS_IO_URING_REGISTER,
	"lsm_get_self_attr":       unix.SYS_LSM_GET_SELF_ATTR,
	"lsm_set_self_attr":       unix.SYS_LSM_SET_SELF_ATTR,
	"lsm_list_modules":        unix.SYS_LSM_LIST_MODULES,
	"kcmp":                    unix.SYS_KCMP,
	"pidfd_getfd":             unix.SYS_PIDFD_GETFD,
	"process_madvise":         unix.SYS_PROCESS_MADVISE,
	"get_mempolicy":           unix.SYS_GET_MEMPOLICY,
	"set_mempolicy":           unix.SYS_SET_MEMPOLICY,
	"set_mempolicy_home_node": unix.SYS_SET_MEMPOLICY_HOME_NODE,
	"mbind":                   unix.SYS_MBIND,
	"migrate_pages":           unix.SYS_MIGRATE_PAGES,
	"move_pages":              unix.SYS_MOVE_PAGES,
}
