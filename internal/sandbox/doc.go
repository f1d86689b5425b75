// Package sandbox is a lease's confinement policy on one shared host: what a lease process
// sees and may do — a uid per lease, a private /tmp and optional network namespace, its
// workdir on /workspace, an image root, Landlock rules, resource limits — and the one
// Execer every lease process is started through. The start itself (a cgroup per lease
// with a child cgroup per command, launchers, leftovers, OOM counts) is package confine's:
// a lease is a cell there, named by its id, and each command a Start this package builds.
//
// Every lease process starts as the helper, which joins the command's cgroup, mounts the
// lease's /tmp, its own /etc/passwd and /etc/group and its workdir on /workspace
// (workspace.go), sets the lease's resource limits (LeaseRlimits), drops to the lease's uid,
// sets no_new_privs, applies Landlock and, last, the system-call filter (package seccomp)
// before it execs the target, so the target is confined from its first instruction and the daemon
// never is. The helper is sidecar-init next to the daemon (the C one from
// cmd/sidecar-init/sidecar-init.c, or its Go twin), else the daemon itself run as
// `sidecar __sandbox-init` (package initproc); all read one config format (initproc.Encode).
//
// Cgroups are package confine's, shared with the script workers; Landlock is package
// landlock, shared the same way.
package sandbox

import "errors"

var (
	// ErrUnknownLease: the lease was not provisioned in this daemon run.
	ErrUnknownLease = errors.New("sandbox: unknown lease")
	// ErrInvalid: bad input (lease id, path, limits, argv, env); nothing was changed.
	ErrInvalid = errors.New("sandbox: invalid request")
	// ErrUnsupported: the request needs isolation this host or mode does not provide.
	ErrUnsupported = errors.New("sandbox: not supported by this host's isolation")
	// ErrLimit: the lease is at one of its own limits (every PTY of its instance open).
	ErrLimit = errors.New("sandbox: lease limit reached")
)
