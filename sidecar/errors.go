package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os/exec"
	"strconv"
	"syscall"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/fsxfer"
	"github.com/sidecar-sandbox/sidecar/internal/process"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/internal/script"
	"github.com/sidecar-sandbox/sidecar/internal/shell"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/lease/image"
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
)

// Error is an error with its place on the wire. Handlers return it (or a package sentinel
// that codeOf knows) and writeError turns it into problem+json.
type Error struct {
	Status int
	Code   string
	Detail string
	// Err is the cause, logged but never sent: it may name host paths.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Detail, e.Err)
	}
	return e.Code + ": " + e.Detail
}

func (e *Error) Unwrap() error { return e.Err }

// errorf makes an *Error whose detail is safe to send.
func errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Detail: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) *Error {
	return errorf(http.StatusBadRequest, apitype.CodeInvalidRequest, format, args...)
}

// sentinel maps the packages' sentinel errors to status and code. Order matters only
// where one error wraps another.
var sentinels = []struct {
	err    error
	status int
	code   string
}{
	{netpolicy.ErrInvalid, http.StatusBadRequest, apitype.CodeInvalidNetworkPolicy},
	{lease.ErrNotFound, http.StatusNotFound, apitype.CodeLeaseNotFound},
	{lease.ErrExpired, http.StatusGone, apitype.CodeLeaseExpired},
	{lease.ErrLimit, http.StatusTooManyRequests, apitype.CodeLeaseLimit},
	{lease.ErrInvalid, http.StatusBadRequest, apitype.CodeInvalidRequest},
	{process.ErrNotFound, http.StatusNotFound, apitype.CodeProcessNotFound},
	{process.ErrInvalid, http.StatusBadRequest, apitype.CodeInvalidRequest},
	{process.ErrLimit, http.StatusTooManyRequests, apitype.CodeLeaseLimit},
	{process.ErrExecLimit, http.StatusTooManyRequests, apitype.CodeExecLimit},
	{process.ErrExited, http.StatusConflict, apitype.CodeConflict},
	{process.ErrStdinClosed, http.StatusConflict, apitype.CodeConflict},
	{shell.ErrNotFound, http.StatusNotFound, apitype.CodeShellNotFound},
	{shell.ErrBusy, http.StatusConflict, apitype.CodeShellBusy},
	{shell.ErrLimit, http.StatusTooManyRequests, apitype.CodeLeaseLimit},
	{shell.ErrInvalid, http.StatusBadRequest, apitype.CodeInvalidRequest},
	{shell.ErrNotReady, http.StatusBadRequest, apitype.CodeInvalidRequest},
	{process.ErrClosed, http.StatusServiceUnavailable, apitype.CodeUnavailable},
	{sandbox.ErrNotLeftover, http.StatusNotFound, apitype.CodeProcessNotFound},
	{sandbox.ErrOutsideWorkdir, http.StatusBadRequest, apitype.CodePathOutsideWorkdir},
	{sandbox.ErrUnsupported, http.StatusNotFound, apitype.CodeCapabilityDisabled},
	{sandbox.ErrInvalid, http.StatusBadRequest, apitype.CodeInvalidRequest},
	{sandbox.ErrUnknownLease, http.StatusNotFound, apitype.CodeLeaseNotFound},
	{sandbox.ErrLimit, http.StatusTooManyRequests, apitype.CodeLeaseLimit},
	{fsxfer.ErrOutside, http.StatusBadRequest, apitype.CodePathOutsideWorkdir},
	{fsxfer.ErrNotFound, http.StatusNotFound, apitype.CodeNotFound},
	{fsxfer.ErrNotDir, http.StatusBadRequest, apitype.CodeNotADirectory},
	{fsxfer.ErrIsDir, http.StatusBadRequest, apitype.CodeIsADirectory},
	{fsxfer.ErrExists, http.StatusConflict, apitype.CodeExists},
	{fsxfer.ErrNotEmpty, http.StatusConflict, apitype.CodeInvalidRequest},
	{fsxfer.ErrQuota, http.StatusInsufficientStorage, apitype.CodeQuotaExceeded},
	{fsxfer.ErrDigest, http.StatusBadRequest, apitype.CodeDigestMismatch},
	{fsxfer.ErrOffsetMismatch, http.StatusConflict, apitype.CodeConflict},
	{fsxfer.ErrNotRegular, http.StatusBadRequest, apitype.CodeInvalidRequest},
	{fsxfer.ErrTooLarge, http.StatusRequestEntityTooLarge, apitype.CodePayloadTooLarge},
	{fsxfer.ErrInvalid, http.StatusBadRequest, apitype.CodeInvalidRequest},
	{fsxfer.ErrPrecondition, http.StatusPreconditionFailed, apitype.CodePreconditionFailed},
	{fsxfer.ErrNoMatch, http.StatusConflict, apitype.CodeOldTextNotFound},
	{fsxfer.ErrAmbiguous, http.StatusConflict, apitype.CodeOldTextNotUnique},
	{fsxfer.ErrSearchLimit, http.StatusTooManyRequests, apitype.CodeSearchLimit},
	{fsxfer.ErrPatternTooComplex, http.StatusBadRequest, apitype.CodePatternTooComplex},
	{fsxfer.ErrWatchLimit, http.StatusTooManyRequests, apitype.CodeWatchLimit},
	{image.ErrUnknown, http.StatusBadRequest, apitype.CodeUnknownImage},
	{image.ErrNotReady, http.StatusServiceUnavailable, apitype.CodeImageNotReady},
	{image.ErrInUse, http.StatusConflict, apitype.CodeImageInUse},
	{image.ErrPulling, http.StatusConflict, apitype.CodeConflict},
	{image.ErrExists, http.StatusConflict, apitype.CodeExists},
	{image.ErrChanged, http.StatusConflict, apitype.CodeConflict},
	{image.ErrSnapshot, http.StatusConflict, apitype.CodeConflict},
	{image.ErrRefused, http.StatusUnprocessableEntity, apitype.CodeSnapshotRefused},
	{image.ErrFull, http.StatusInsufficientStorage, apitype.CodeQuotaExceeded},
	{script.ErrDisabled, http.StatusNotFound, apitype.CodeCapabilityDisabled},
	{script.ErrClosed, http.StatusServiceUnavailable, apitype.CodeUnavailable},
	{script.ErrBusy, http.StatusServiceUnavailable, apitype.CodeUnavailable},
}

// problemOf turns any error into the problem body the client sees. Unknown errors are
// "internal" and their text is not sent.
func problemOf(err error) apitype.Problem {
	p := apitype.Problem{Status: http.StatusInternalServerError, Code: apitype.CodeInternal, Detail: "internal error"}
	var (
		e     *Error
		se    *script.Error
		mbErr *http.MaxBytesError
		setup *sandbox.SetupError
	)
	switch {
	case errors.As(err, &e):
		p.Status, p.Code, p.Detail = e.Status, e.Code, e.Detail
	case errors.As(err, &se):
		p.Status, p.Code, p.Detail = http.StatusUnprocessableEntity, apitype.CodeScriptError, se.Message
		p.Line, p.Column = se.Line, se.Column
		if se.Kind == "timeout" {
			p.Code = apitype.CodeScriptTimeout
		}
	case errors.As(err, &setup):
		p.Status, p.Code = http.StatusInternalServerError, apitype.CodeSandboxSetupFailed
		p.Detail = "sandbox setup failed at step " + strconv.Quote(setup.Step)
	case errors.As(err, &mbErr):
		p.Status, p.Code = http.StatusRequestEntityTooLarge, apitype.CodePayloadTooLarge
		p.Detail = fmt.Sprintf("request body over %d bytes", mbErr.Limit)
	case errors.Is(err, process.ErrStart) && (errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist)):
		// The command is not there (or not executable) inside the lease: the request's fault.
		p.Status, p.Code, p.Detail = http.StatusBadRequest, apitype.CodeInvalidRequest, truncate(err.Error(), 300)
	case errors.Is(err, process.ErrStart) && errors.Is(err, syscall.EAGAIN):
		// No process slot: on cgroup v2 a command is born in the lease's cgroup, so a lease
		// whose processes (leftovers, say) hold its whole pids limit cannot start one.
		p.Status, p.Code = http.StatusTooManyRequests, apitype.CodeLeaseLimit
		p.Detail = "cannot start a process: the lease's processes hold all of its pids limit (or the host's); stop some (leftovers: POST …/leftovers/{pid}/signal)"
	case errors.Is(err, context.DeadlineExceeded):
		p.Status, p.Code, p.Detail = http.StatusServiceUnavailable, apitype.CodeUnavailable, "deadline exceeded"
	default:
		for _, s := range sentinels {
			if errors.Is(err, s.err) {
				// Sentinel-wrapping messages carry the reason; host paths in them are
				// redacted by the server before sending.
				p.Status, p.Code, p.Detail = s.status, s.code, truncate(err.Error(), 300)
				break
			}
		}
	}
	p.Title = http.StatusText(p.Status)
	p.Type = apitype.ProblemTypePrefix + p.Code
	return p
}

// imageRetrySeconds is the Retry-After of 503 image_not_ready: a pull's progress is
// worth a look that often.
const imageRetrySeconds = 5

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// writeError writes err as problem+json and logs the cause at a level that fits it.
// redact removes host paths from the detail.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, redact func(string) string, err error) {
	p := problemOf(err)
	if redact != nil {
		p.Detail = redact(p.Detail)
	}
	if p.Status >= 500 && p.Status != http.StatusInsufficientStorage {
		log.ErrorContext(r.Context(), "request failed", "method", r.Method, "path", r.URL.Path, "status", p.Status, "err", err)
	} else {
		log.DebugContext(r.Context(), "request refused", "method", r.Method, "path", r.URL.Path, "status", p.Status, "code", p.Code, "err", err)
	}
	if p.Code == apitype.CodeImageNotReady {
		w.Header().Set("Retry-After", strconv.Itoa(imageRetrySeconds))
	}
	if p.Status == http.StatusUnauthorized {
		w.Header().Set(apitype.HeaderWWWAuthenticate, `Bearer realm="sidecar"`)
	}
	h := w.Header()
	h.Del("Content-Length")
	h.Del("Content-Digest")
	h.Del("ETag")
	h.Set("Content-Type", apitype.ProblemContentType)
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}
