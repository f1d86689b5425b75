package fsxfer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
)

// pathError keeps the operation and the lease-relative path for logs while letting
// errors.Is see the sentinel. It never carries an absolute host path.
type pathError struct {
	op, path string
	err      error // a sentinel (possibly refined)
	cause    error // the underlying system error, if any
}

func (e *pathError) Error() string {
	msg := e.op + " " + quoteName(e.path) + ": " + e.err.Error()
	if e.cause != nil && e.cause.Error() != e.err.Error() {
		msg += " (" + e.cause.Error() + ")"
	}
	return msg
}

func (e *pathError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.err}
	}
	return []error{e.err, e.cause}
}

func quoteName(p string) string {
	if p == "" {
		return `"."`
	}
	return fmt.Sprintf("%q", p)
}

// wrap classifies a system error from an operation on path into a sentinel.
// Errors that already carry a sentinel pass through unchanged.
func wrap(op, path string, err error) error {
	if err == nil {
		return nil
	}
	var pe *pathError
	if errors.As(err, &pe) {
		return err
	}
	return &pathError{op: op, path: path, err: classify(err), cause: cause(err)}
}

func cause(err error) error {
	var perr *fs.PathError
	if errors.As(err, &perr) {
		return perr.Err
	}
	return err
}

// errRootEscape is the text os.Root uses for a path that resolves outside it; the
// error value itself is unexported, so the text is all there is to match on.
const errRootEscape = "path escapes from parent"

func classify(err error) error {
	for _, s := range []error{ErrOutside, ErrNotFound, ErrNotDir, ErrIsDir, ErrExists,
		ErrNotEmpty, ErrQuota, ErrDigest, ErrOffsetMismatch, ErrNotRegular, ErrInvalid, ErrTooLarge,
		ErrPrecondition, ErrNoMatch, ErrAmbiguous, ErrWatchLimit, ErrSearchLimit, ErrPatternTooComplex} {
		if errors.Is(err, s) {
			return err
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err // the caller went away: not the request's fault, nor the file's
	}
	if cause(err).Error() == errRootEscape {
		return ErrOutside
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return ErrInvalid
	}
	switch errno {
	case syscall.ENOENT:
		return ErrNotFound
	case syscall.ENOTDIR:
		return ErrNotDir
	case syscall.EISDIR:
		return ErrIsDir
	case syscall.EEXIST:
		return ErrExists
	case syscall.ENOTEMPTY:
		return ErrNotEmpty
	case syscall.ENOSPC, syscall.EDQUOT:
		return ErrQuota
	case syscall.ENAMETOOLONG:
		return ErrNameTooLong
	case syscall.ELOOP:
		return ErrNotRegular // O_NOFOLLOW met a symlink where a file was wanted
	case syscall.EBUSY, syscall.EXDEV:
		return ErrMountPoint
	case syscall.EFBIG:
		return ErrTooLarge
	}
	return ErrInvalid
}
