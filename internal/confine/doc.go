// Package confine is the confinement engine: the one way a confined process is started
// and accounted for, whoever asks (a lease's command, a script worker). It owns the
// machinery of confinement and none of its policy: cgroups on v1 and v2 (Cgroups), the
// daemon's cells under its cgroup parent with their child cgroups (Engine), and the helper
// every confined process starts through (package initproc, its config codec and Go twin).
// It knows nothing of leases' workspaces, users, images or HTTP: what a process may see
// and do is decided above it (package sandbox for leases) and handed down as an
// initproc.Config.
//
// Its unit is a cell: a cgroup subtree under the daemon's cgroup parent that holds the
// limits (Limits), with a child cgroup per process tree started in it, which can be killed
// and asked about OOM kills on its own. A lease's cell is named by the lease's id; a
// named Cell (the script workers' "_scripts") starts with "_", which no lease id does, so
// a sweep of orphan cells leaves it alone (IsCell).
//
//	cg, _ := confine.OpenCgroups(parent, log) // the parent, on this host's cgroup version
//	e := confine.NewEngine(cg, log)
//	e.Open(id, confine.Limits{…})             // a cell, made or adopted
//	child, _ := e.TakeChild(id)               // a fresh child cgroup, made ahead
//	cg.ChildDir(id, child) / cg.JoinFiles(…)  // where the helper enters it
//	e.ReturnSpare(id, child)                  // never entered: a spare again
//	e.KeepLeftovers(id, child) || e.DropChild(id, child) // a closed tree's child
//	e.LeftoverPids(id); e.PruneLeftovers(id)
//	e.Usage(id); e.Remove(ctx, id); e.Sweep(ctx, known); e.Close()
//
//	cell, _ := confine.NewCell(parent, "scripts", log) // a named cell for the daemon's own helpers
//	cell.NewChild(w, limit); cell.Join(w, pid); cell.OOMKills(w); cell.RemoveChild(ctx, w)
//
// The engine's next part is the start itself, which package sandbox still holds: the
// launchers (a helper started ahead for a cell's next tree) with their timing, and the
// choice between a launched and a plain start. Its interface here:
//
//	type Start struct {
//		Config initproc.Config // everything but the cgroup, which the engine adds
//		Dir    string          // where the helper starts, on the host
//		NetNS  *os.File        // the network namespace to enter, nil for the host's
//		NewNS  bool            // a mount namespace per process
//		TTY    bool
//	}
//	e.Command(id string, s Start) (*exec.Cmd, Tree, error) // launched when a launcher is ready, else plain
//	e.Template(id string, base func() Start)                // what a launcher is made with, ahead
//
// and sandbox keeps only Command's policy half: the view, the environment and the argv
// check.
//
// Cgroups are driven through their files (package cgroupfs), not containerd/cgroups'
// managers: a confined process joins its cgroup in the helper or by clone3, never through
// a manager, and the daemon writes a few limits and reads a few counters; the module's v1
// package would also pull in protobuf and runtime-spec.
package confine

import "errors"

// DefaultParent is the cgroup parent when none is configured.
const DefaultParent = "sidecar"

var (
	// ErrInvalid: bad input (a cgroup parent or cell name); nothing was changed.
	ErrInvalid = errors.New("confine: invalid request")
	// ErrUnsupported: this host cannot confine (not root, no cgroup controllers).
	ErrUnsupported = errors.New("confine: not supported by this host")
)
