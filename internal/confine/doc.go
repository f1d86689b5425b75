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
//	e := confine.NewEngine(confine.EngineConfig{Cgroups: cg, Helper: …, HelperArg: …})
//	e.Open(id, confine.Limits{…})                // a cell, made or adopted
//	e.SetTemplate(id, func() confine.Start {…})  // what its launchers are made with
//	cmd, tree, _ := e.Command(id, confine.Start{Config: cfg, Dir: …, NetNS: …, TTY: …})
//	tree.Start(); cmd.Wait(); tree.Close()       // launched when a launcher is ready, else plain
//	e.Usage(id); e.LeftoverPids(id); e.PruneLeftovers(id)
//	e.Remove(ctx, id); e.Sweep(ctx, known); e.Close()
//
//	cell, _ := confine.NewCell(parent, "scripts", log) // a named cell for the daemon's own helpers
//	cell.NewChild(w, limit); cell.Join(w, pid); cell.OOMKills(w); cell.RemoveChild(ctx, w)
//
// A Start is the policy's whole say: the helper's initproc.Config (uid, mounts, Landlock,
// seccomp, rlimits, argv, environment), where the helper starts on the host, the network
// namespace to enter and whether it gets a mount namespace. The engine adds the cgroup
// and chooses how to start, in Tree.Start: a tree goes to the cell's launcher when one is
// ready (launcher.go, with the timing that decides when launchers are made; the launcher
// sits in a child cgroup of its own), else to one its cell's zygote forks for it at once
// (zygote.go: the C helper, which made the cell's mounts once, forks each launcher), else
// it takes an empty child cgroup of its cell (made ahead, or emptied by an earlier tree:
// children.go) and starts the helper the plain way (start.go). A closed tree's child that
// still holds processes stays as the cell's leftovers (leftovers.go); the OOM kills of
// removed children stay in the cell's tally.
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
