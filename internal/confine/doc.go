// Package confine is the confinement engine: the one way a confined process is started
// and accounted for, whoever asks (a lease's command, a script worker). It owns the
// machinery of confinement and none of its policy: cgroups on v1 and v2 (Cgroups), the
// daemon's cells under its cgroup parent, and the helper every confined process starts
// through (package initproc, its config codec and Go twin). It knows nothing of leases'
// workspaces, users, images or HTTP: what a process may see and do is decided above it
// (package sandbox for leases) and handed down as an initproc.Config.
//
// Its unit is a cell: a cgroup subtree under the daemon's cgroup parent that holds the
// limits (Limits), with a child cgroup per started process tree, which can be killed and
// asked about OOM kills on its own. A lease is a cell named by its id; a named Cell (the
// script workers' "_scripts") is one whose name starts with "_", which no lease id does,
// so a sweep of orphan leases leaves it alone (IsCell).
//
//	cg, err := confine.OpenCgroups(parent, log)  // the parent on this host's version
//	cg.Provision(id, confine.Limits{...})         // a cell, made or adopted
//	cg.NewChild(id, child); cg.ChildDir / JoinFiles // where a helper enters
//	cg.KillChild / ChildOOMKills / ChildPids / RemoveChild
//	cg.Usage(id, counted); cg.KillCell; cg.RemoveCell; cg.Cells()
//
//	cell, err := confine.NewCell(parent, "scripts", log) // a named cell for the daemon's own helpers
//	cell.NewChild(w, limit); cell.Join(w, pid); cell.OOMKills(w); cell.RemoveChild(ctx, w)
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
