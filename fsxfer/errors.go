package fsxfer

import (
	"errors"
	"fmt"
)

// Sentinel errors. The HTTP layer maps them to the contract's codes:
// ErrOutside → path_outside_workdir, ErrNotDir → not_a_directory, ErrIsDir → is_a_directory,
// ErrExists → exists, ErrQuota → quota_exceeded (507), ErrDigest → digest_mismatch,
// ErrTooLarge → payload_too_large, ErrNotFound → not_found, ErrOffsetMismatch → conflict
// (409), and ErrNotEmpty, ErrNotRegular, ErrInvalid → invalid_request.
var (
	ErrOutside        = errors.New("path outside the workdir")
	ErrNotFound       = errors.New("no such file or directory")
	ErrNotDir         = errors.New("not a directory")
	ErrIsDir          = errors.New("is a directory")
	ErrExists         = errors.New("file exists")
	ErrNotEmpty       = errors.New("directory not empty")
	ErrQuota          = errors.New("disk quota exceeded")
	ErrDigest         = errors.New("digest mismatch")
	ErrOffsetMismatch = errors.New("upload offset mismatch")
	ErrNotRegular     = errors.New("not a regular file")
	ErrInvalid        = errors.New("invalid request")
	ErrTooLarge       = errors.New("too large")
	// ErrPrecondition: the file is not in the state a conditional write asked for
	// (If-Match: 412 precondition_failed).
	ErrPrecondition = errors.New("precondition failed")
	// ErrNoMatch and ErrAmbiguous: an exact replacement found its old text nowhere, or
	// more than once when one was asked for.
	ErrNoMatch   = errors.New("old text not found")
	ErrAmbiguous = errors.New("old text found more than once")
)

// Refinements of the sentinels above: errors.Is matches both the refinement and the
// sentinel it wraps, so the HTTP layer only needs to know the twelve sentinels.
var (
	// ErrMountPoint: an operation would cross a mount point. Matches ErrInvalid.
	ErrMountPoint = fmt.Errorf("%w: crosses a mount point", ErrInvalid)
	// ErrNameTooLong: a path or one of its names is over the limit. Matches ErrInvalid.
	ErrNameTooLong = fmt.Errorf("%w: name too long", ErrInvalid)
	// ErrForeignLink: a file with other hard links that does not belong to the lease uid
	// (it may be a link to a file outside the workdir). Matches ErrNotRegular.
	ErrForeignLink = fmt.Errorf("%w: hard-linked file not owned by the lease", ErrNotRegular)
	// ErrUploadsDisabled: resumable uploads need Config.UploadsDir. Matches ErrInvalid.
	ErrUploadsDisabled = fmt.Errorf("%w: resumable uploads are not configured", ErrInvalid)
)
