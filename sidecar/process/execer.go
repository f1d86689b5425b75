package process

import (
	"os"
	"os/exec"
	"syscall"
)

// Spec is one process to start inside a lease.
type Spec struct {
	Argv []string
	// Env is the request's environment; the Execer adds the clean base (PATH, HOME, LANG, TERM).
	Env map[string]string
	// Dir is relative to the lease workdir ("" is the workdir itself).
	Dir string
	TTY bool
}

// Execer prepares lease processes. It is the one place lease processes come from: the
// returned command, once started, runs inside the lease's cgroup from its first
// instruction, as the lease's uid, with a clean environment, in its own session and
// process group, with no inherited descriptors beyond 0-2.
//
// The caller sets Stdin/Stdout/Stderr (or a PTY) on the command, starts it, waits for it,
// and then calls Tree.Close.
type Execer interface {
	Command(leaseID string, spec Spec) (*exec.Cmd, Tree, error)
}

// PTYOpener is implemented by an Execer whose leases have PTYs of their own (a devpts
// instance each, package sandbox): a TTY command's PTY comes from OpenPTY, not from the
// host's /dev/ptmx, so that no lease can take the host's PTYs. master and slave are
// close-on-exec; the slave becomes the command's 0-2.
type PTYOpener interface {
	OpenPTY(leaseID string) (master, slave *os.File, err error)
}

// Tree is everything one started command may fork: its own child cgroup (or, without
// cgroups, its process group).
type Tree interface {
	// Kill sends SIGKILL to every process in the tree, including those that called
	// setsid or double-forked, and returns once the tree is empty (a bounded wait).
	Kill() error
	// Signal delivers sig to the command's process group.
	Signal(sig syscall.Signal) error
	// OOMKilled reports whether the kernel's OOM killer killed a process of the tree.
	OOMKilled() bool
	// Close kills what is left and releases the tree's resources. Call it after Wait.
	Close() error
}
