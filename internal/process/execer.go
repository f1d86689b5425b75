package process

import (
	"os"
	"os/exec"

	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
)

// Spec and Tree are the sandbox's: this package supervises what the isolation layer
// below it starts.
type (
	Spec = sandbox.Spec
	Tree = sandbox.Tree
)

// Execer prepares lease processes (package sandbox's Sandbox is the one). The returned
// command, once started with Tree.Start, runs inside the lease's cgroup from its first
// instruction, as the lease's uid, with a clean environment, in its own session and
// process group, with no inherited descriptors beyond 0-2.
//
// The caller sets Stdin/Stdout/Stderr (or a PTY) on the command, starts it through the
// Tree, waits for it, and then calls Tree.Close (which leaves what the command left behind
// in the lease; Tree.Kill first to take it too).
type Execer interface {
	Command(leaseID string, spec Spec) (*exec.Cmd, Tree, error)
}

var _ interface {
	Execer
	PTYOpener
} = (*sandbox.Sandbox)(nil)

// PTYOpener is implemented by an Execer whose leases have PTYs of their own (a devpts
// instance each, package sandbox): a TTY command's PTY comes from OpenPTY, not from the
// host's /dev/ptmx, so that no lease can take the host's PTYs. master and slave are
// close-on-exec; the slave becomes the command's 0-2.
type PTYOpener interface {
	OpenPTY(leaseID string) (master, slave *os.File, err error)
}
