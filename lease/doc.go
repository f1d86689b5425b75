// Package lease owns the life of a lease: one session's sandbox with a private directory,
// limits, an optional uid of its own and a time to live. It acquires, renews, releases and
// expires leases, keeps them in an append-only, checksummed journal (one fsynced record
// per change, journal.go) so they survive a daemon restart, keeps leases of the default
// shape made ahead (spare.go), and issues and verifies the lease tokens (JWT) that grant
// access to one lease.
//
// It knows nothing of HTTP: callers map the sentinel errors (ErrNotFound, ErrExpired,
// ErrLimit, ErrInvalid, ErrTokenInvalid) to status codes. What it does not own (cgroups,
// chown of the workdir, network namespaces) it delegates to a Provisioner.
package lease
