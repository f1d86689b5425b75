package lease

import "errors"

// Sentinel errors. Returned errors wrap them with detail; test with errors.Is.
var (
	// ErrNotFound: no such lease, or it is already released (or being released).
	ErrNotFound = errors.New("lease not found")
	// ErrExpired: the lease is past its expiry and waits for the reaper.
	ErrExpired = errors.New("lease expired")
	// ErrLimit: no room for another lease (MaxLeases, or the uid range is used up).
	ErrLimit = errors.New("lease limit reached")
	// ErrInvalid: the request is malformed or over a configured maximum.
	ErrInvalid = errors.New("invalid lease request")
	// ErrTokenInvalid: a lease token failed verification, for whatever reason.
	ErrTokenInvalid = errors.New("invalid lease token")
	// ErrCorruptState: the state file cannot be read back; Open refuses to start on it.
	ErrCorruptState = errors.New("corrupt lease state")
)
