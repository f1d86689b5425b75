package process

import "errors"

// Sentinel errors; the HTTP layer maps them to stable codes (suggested mapping in
// parentheses).
var (
	// ErrNotFound: no such process in this lease (process_not_found).
	ErrNotFound = errors.New("process: not found")
	// ErrInvalid: bad input — argv, id, size, signal name, offset (invalid_request).
	ErrInvalid = errors.New("process: invalid request")
	// ErrLimit: the lease already runs MaxProcesses background processes (invalid_request
	// or a 429; the v1 table has no dedicated code).
	ErrLimit = errors.New("process: too many running processes")
	// ErrExecLimit: the lease already runs MaxExecs Execs (a 429, exec_limit).
	ErrExecLimit = errors.New("process: too many execs running")
	// ErrStart wraps why a command could not be started, e.g. exec.ErrNotFound
	// (invalid_request), a *sandbox.SetupError (sandbox_setup_failed), else internal.
	ErrStart = errors.New("process: cannot start")
	// ErrStdinClosed: stdin was closed, never opened, or the process ended (conflict).
	ErrStdinClosed = errors.New("process: stdin closed")
	// ErrExited: the operation needs a running process (conflict).
	ErrExited = errors.New("process: not running")
	// ErrClosed: the Manager was shut down or the Subscription closed (unavailable).
	ErrClosed = errors.New("process: closed")
)
