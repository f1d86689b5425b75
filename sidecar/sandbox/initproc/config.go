// Package initproc is the sandbox helper that every lease process starts as: it joins the
// lease's cgroups, makes /tmp private, drops to the lease's uid, sets no_new_privs, applies
// Landlock and then execs the target. It is its own package, importing little beyond the
// standard library, so that a helper binary built from it starts fast; the daemon side is
// package sandbox.
package initproc

// Descriptors the helper finds open; everything else above 2 is closed before the target runs.
const (
	// ConfigFD holds the JSON Config (a sealed memfd written by the daemon).
	ConfigFD = 3
	// ReportFD is the write end of a pipe, close-on-exec in the helper: a setup failure is
	// written there as one line before the helper exits; a successful exec closes it empty.
	ReportFD = 4
	// NetNSFD is the lease's network namespace, present when Config.NetNS is set.
	NetNSFD = 5
)

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
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	// Dir is the absolute working directory, entered after privileges are dropped.
	Dir string `json:"dir"`
	// UID and GID to drop to; 0 leaves credentials alone (isolation "none").
	UID int `json:"uid"`
	GID int `json:"gid"`
	// CgroupProcs are the cgroup.procs files (one per v1 hierarchy) the helper writes its
	// pid to before anything else; empty on v2 (CLONE_INTO_CGROUP) and without cgroups.
	CgroupProcs []string `json:"cgroup_procs,omitempty"`
	// TmpDir is bind-mounted on /tmp inside the helper's private mount namespace.
	TmpDir string `json:"tmp_dir,omitempty"`
	// HostMountNS is the daemon's mount namespace (readlink of /proc/self/ns/mnt): the
	// helper refuses to mount anything if it finds itself still in it.
	HostMountNS string `json:"host_mount_ns,omitempty"`
	// NetNS says NetNSFD is a network namespace to join.
	NetNS bool `json:"netns,omitempty"`
	// Landlock is the filesystem policy; nil applies none.
	Landlock *Landlock `json:"landlock,omitempty"`
}

// Landlock is a path policy. Paths that do not exist on this host are skipped.
type Landlock struct {
	// MinABI is the lowest Landlock ABI accepted: below it the helper fails (strict
	// isolation); 0 means best effort (isolation "none").
	MinABI int      `json:"min_abi"`
	RW     []string `json:"rw,omitempty"`  // directories: full access
	RX     []string `json:"rx,omitempty"`  // directories: read and execute
	RO     []string `json:"ro,omitempty"`  // directories: read only
	Dev    []string `json:"dev,omitempty"` // device files or directories of them: read, write, ioctl
}
