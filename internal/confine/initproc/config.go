// Package initproc is the sandbox helper that every lease process starts as: it joins the
// lease's cgroups, makes /tmp private, binds the lease's workdir on /workspace and its own
// /etc/passwd and /etc/group (inside the lease's image root, then pivoting into it, for a
// lease in an image: root.go), drops to the lease's uid, sets no_new_privs, applies
// Landlock and then execs the target. It is its own package, importing little beyond the
// standard library, so that a helper binary built from it starts fast; the daemon side is
// package sandbox. cmd/sidecar-init/sidecar-init.c is the same helper in C (what `make
// build` installs when a C compiler exists); both read the one config format below.
package initproc

import "golang.org/x/sys/unix"

// Descriptors the helper finds open; everything else above 2 is closed before the target runs.
const (
	// ConfigFD holds the encoded Config (a sealed memfd written by the daemon).
	ConfigFD = 3
	// ReportFD is the write end of a pipe, close-on-exec in the helper: a setup failure is
	// written there as "<exit code> <message>" before the helper exits; a successful exec
	// closes it empty.
	ReportFD = 4
	// NetNSFD is the lease's network namespace, present when Config.NetNS is set.
	NetNSFD = 5
	// LaunchFD is a launcher's launch socket (Config.Await; launch.go), SOCK_SEQPACKET.
	LaunchFD = 6
	// UserNSFD is the lease's user namespace, present when Config.UserNS is set.
	UserNSFD = 7
	// MountNSFD is the mount namespace the helper copies, present when Config.MountNS is set.
	MountNSFD = 8
	// TreeFD is the first of Config.Trees' descriptors, one after another in their order.
	TreeFD = 9
	// MaxTrees bounds Config.Trees (a lease has at most eight bind sources).
	MaxTrees = 16
)

// Workspace is where lease processes see their workdir (Config.WorkDir). It must exist on
// the host as an empty directory: the mount point of every lease's bind.
const Workspace = "/workspace"

// HomeMount is where lease processes see Config.Home; the lease's HOME is a directory in it.
const HomeMount = "/home"

// CgroupMount is where the host's cgroup tree is mounted; privateCgroups hides it.
const CgroupMount = "/sys/fs/cgroup"

// Exit codes of a helper that could not start its target, chosen like env(1) and shells do.
const (
	ExitSetup       = 125 // the sandbox could not be set up
	ExitCannotExec  = 126 // the target exists but could not be executed
	ExitNotFound    = 127 // no such executable
	MaxConfigSize   = 4 << 20
	reportMaxLength = 1024
)

// Config is everything the helper needs; it travels on ConfigFD, never in the environment
// or argv, so nothing of it reaches the target.
type Config struct {
	Argv []string
	Env  []string
	// Dir is the absolute working directory, entered after privileges are dropped.
	Dir string
	// UID and GID to drop to; 0 leaves credentials alone (isolation "none").
	UID int
	GID int
	// CgroupProcs are the cgroup.procs files (one per v1 hierarchy) the helper writes its
	// pid to before anything else; empty on v2 (CLONE_INTO_CGROUP) and without cgroups.
	CgroupProcs []string
	// TmpDir is bind-mounted on /tmp inside the helper's private mount namespace.
	TmpDir string
	// HostMountNS is the daemon's mount namespace (readlink of /proc/self/ns/mnt): the
	// helper refuses to mount anything if it finds itself still in it.
	HostMountNS string
	// PTSDir is the lease's devpts instance, bound on /dev/pts (and its ptmx on /dev/ptmx)
	// inside the helper's private mount namespace.
	PTSDir string
	// Passwd and Group are the lease's own user and group files (written by the daemon,
	// read-only to the lease), bound over /etc/passwd and /etc/group inside the private
	// mount namespace, so that the lease's uid has a name for every tool, NSS or not.
	Passwd string
	Group  string
	// Resolv is the lease's resolv.conf, naming the resolver the daemon runs inside the
	// lease's network namespace, bound over /etc/resolv.conf likewise.
	Resolv string
	// Home is the lease's home directory tree, bound on HomeMount (nosuid, nodev) inside the
	// private mount namespace: the lease's HOME lives there, on the lease's disk, not in its
	// workdir. "": none (HOME is the workdir).
	Home string
	// WorkDir is the lease's workdir, bound on Workspace (nosuid, nodev) inside the
	// private mount namespace, the last of the mounts: lease processes never need the
	// host's path to it.
	WorkDir string
	// Detach are the directories under which the daemon mounts every lease's filesystems,
	// each a mount point: on the host's root, the helper detaches them from its private
	// mount namespace after its own binds, so that the namespace, a copy of the daemon's,
	// holds no other lease's mounts (a copy of each, per lease, would grow with the square
	// of the leases held). With a Root, pivoting detaches them with the rest.
	Detach []string
	// MountNS says MountNSFD is the mount namespace to copy for the private one instead of
	// the daemon's: the daemon's without the Detach roots' mounts (sandbox's
	// HelperMountNS), so that making the view costs the same with one lease held or a
	// thousand. The bind sources come as Trees. Only the C helper can
	// (ErrMountNSNeedsC): setns into a mount namespace takes a process that shares its
	// filesystem attributes with no other thread.
	MountNS bool
	// Trees (with MountNS) are the bind sources, each under a Detach root (BindSources):
	// TreeFD+i is a detached copy (open_tree) of what the daemon sees at Trees[i], which
	// the helper puts back at the same path, on a tmpfs over its root, before its binds,
	// so that they bind what they would in a copy of the daemon's namespace; detaching
	// the roots drops them.
	Trees []string
	// Root is the lease's root directory (an overlay the daemon mounted): every mount
	// above goes into it instead of the host's root, with a /dev of its own, and the
	// helper pivots into it after the last (root.go). "": the host's root.
	Root string
	// NetNS says NetNSFD is a network namespace to join.
	NetNS bool
	// Landlock is the filesystem policy; nil applies none.
	Landlock *Landlock
	// Rlimits are set (soft = hard) before the uid drop.
	Rlimits []Rlimit
	// Seccomp is the system-call filter (package seccomp's Program, assembled once by the
	// daemon), loaded as the last step before exec; nil: none.
	Seccomp []unix.SockFilter
	// UserNS says UserNSFD is the lease's user namespace, whose only ids, uid and gid 0,
	// map onto UID and GID: instead of dropping to UID, the helper enters it as root, who
	// owns there what the lease's uid owns on the host and nothing else. Needs UID and
	// GID; only the C helper can (setns into a user namespace takes a single-threaded
	// process, and a Go program has several threads).
	UserNS bool
	// Await makes the helper a launcher: Argv, Env and Dir are empty; it sets up
	// everything else, then waits on LaunchFD for the command (launch.go).
	Await bool
	// Fork (with Await) makes the helper a zygote: it joins its cgroup and network
	// namespace and makes its mounts, then forks a launcher, which takes the other
	// steps, for each request on LaunchFD (config "await" "fork"). Only the C helper
	// can (ErrForkNeedsC): a Go program cannot fork and go on running.
	Fork bool
}

// Rlimit is one resource limit: Name is a key of RlimitResources.
type Rlimit struct {
	Name  string
	Value int
}

// RlimitResources are the limits a config may carry, by name (config key "rlimit_<name>").
var RlimitResources = map[string]int{
	"nofile":     unix.RLIMIT_NOFILE,
	"core":       unix.RLIMIT_CORE,
	"memlock":    unix.RLIMIT_MEMLOCK,
	"msgqueue":   unix.RLIMIT_MSGQUEUE,
	"sigpending": unix.RLIMIT_SIGPENDING,
}

// Landlock is a path policy. Paths that do not exist on this host are skipped.
type Landlock struct {
	// MinABI is the lowest Landlock ABI accepted: below it the helper fails, so that a
	// helper never applies less than the daemon promised; 0 means best effort.
	MinABI int
	// MaxABI caps the ABI applied (tests run the isolation checks at each lower ABI on
	// one kernel); 0: no cap, the best the kernel has.
	MaxABI int
	RW     []string // directories: full access
	RX     []string // directories: read and execute
	RO     []string // directories: read only
	Dev    []string // device files or directories of them: read, write, ioctl
}
