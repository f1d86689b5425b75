package client

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"syscall"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Sentinel errors, one per stable problem code of the wire contract. An *APIError matches
// the sentinel of its code, so callers write errors.Is(err, client.ErrLeaseExpired).
var (
	ErrUnauthorized       = errors.New("unauthorized")
	ErrForbidden          = errors.New("forbidden")
	ErrInvalidRequest     = errors.New("invalid request")
	ErrNotFound           = errors.New("not found")
	ErrLeaseNotFound      = errors.New("lease not found")
	ErrLeaseExpired       = errors.New("lease expired")
	ErrLeaseLimit         = errors.New("lease limit reached")
	ErrExecLimit          = errors.New("exec limit reached")
	ErrProcessNotFound    = errors.New("process not found")
	ErrPathOutsideWorkdir = errors.New("path outside workdir")
	ErrNotADirectory      = errors.New("not a directory")
	ErrIsADirectory       = errors.New("is a directory")
	ErrExists             = errors.New("already exists")
	ErrQuotaExceeded      = errors.New("disk quota exceeded")
	ErrDigestMismatch     = errors.New("digest mismatch")
	ErrPayloadTooLarge    = errors.New("payload too large")
	ErrCapability         = errors.New("capability disabled")
	ErrScript             = errors.New("script error")
	ErrScriptTimeout      = errors.New("script timeout")
	ErrUnavailable        = errors.New("service unavailable")
	ErrInternal           = errors.New("internal server error")
	// ErrPreconditionFailed: a conditional write found the file in another state
	// (If-Match with a stale ETag, If-None-Match: * on an existing file).
	ErrPreconditionFailed = errors.New("precondition failed")
	// ErrOldTextNotFound and ErrOldTextNotUnique: an exact replacement found its old
	// text nowhere, or more than once without All.
	ErrOldTextNotFound  = errors.New("old text not found")
	ErrOldTextNotUnique = errors.New("old text not unique")
	// ErrSandboxSetupFailed: a step of the lease's sandbox failed before the command ran;
	// the APIError's Detail names the step.
	ErrSandboxSetupFailed = errors.New("sandbox setup failed")
	// ErrDraining: the daemon is draining and takes no new lease (a session's existing
	// lease is still returned). A client of several sidecars places the lease elsewhere.
	ErrDraining = errors.New("sidecar draining")
	// ErrShellNotFound: no such shell session, or its shell has ended.
	ErrShellNotFound = errors.New("shell session not found")
	// ErrShellBusy: the shell session is running a command.
	ErrShellBusy = errors.New("shell session busy")
	// ErrInvalidNetworkPolicy: a network policy the daemon refuses (an entry it cannot
	// read, or one inside a range only SIDECAR_NETWORK_PRIVATE_ALLOW opens); the
	// APIError's Detail names the entry.
	ErrInvalidNetworkPolicy = errors.New("invalid network policy")
	// ErrPortUnreachable: nothing listens on that port inside the lease.
	ErrPortUnreachable = errors.New("port unreachable")
	// ErrSearchLimit: the lease or the daemon runs as many greps at once as it may, or
	// the daemon's search memory budget cannot hold the pattern; retry shortly.
	ErrSearchLimit = errors.New("search limit reached")
	// ErrPatternTooComplex: the grep pattern compiles to too many instructions.
	ErrPatternTooComplex = errors.New("pattern too complex")
	// ErrWatchLimit: the lease's or the daemon's inotify budget is spent.
	ErrWatchLimit = errors.New("watch limit reached")
	// ErrUnknownImage: the image named is not one of the operator's.
	ErrUnknownImage = errors.New("unknown image")
	// ErrImageNotReady: the image is being pulled, failed to pull, or was removed.
	ErrImageNotReady = errors.New("image not ready")
	// ErrImageInUse: an image cannot be removed while leases run on it.
	ErrImageInUse = errors.New("image in use")
	// ErrSnapshotRefused: the lease holds what an image layer cannot; the detail names it.
	ErrSnapshotRefused = errors.New("snapshot refused")
)

var sentinelByCode = map[string]error{
	apitype.CodeUnauthorized:         ErrUnauthorized,
	apitype.CodeForbidden:            ErrForbidden,
	apitype.CodeInvalidRequest:       ErrInvalidRequest,
	apitype.CodeNotFound:             ErrNotFound,
	apitype.CodeLeaseNotFound:        ErrLeaseNotFound,
	apitype.CodeLeaseExpired:         ErrLeaseExpired,
	apitype.CodeLeaseLimit:           ErrLeaseLimit,
	apitype.CodeExecLimit:            ErrExecLimit,
	apitype.CodeProcessNotFound:      ErrProcessNotFound,
	apitype.CodePathOutsideWorkdir:   ErrPathOutsideWorkdir,
	apitype.CodeNotADirectory:        ErrNotADirectory,
	apitype.CodeIsADirectory:         ErrIsADirectory,
	apitype.CodeExists:               ErrExists,
	apitype.CodeQuotaExceeded:        ErrQuotaExceeded,
	apitype.CodeDigestMismatch:       ErrDigestMismatch,
	apitype.CodePayloadTooLarge:      ErrPayloadTooLarge,
	apitype.CodeCapabilityDisabled:   ErrCapability,
	apitype.CodeScriptError:          ErrScript,
	apitype.CodeScriptTimeout:        ErrScriptTimeout,
	apitype.CodeUnavailable:          ErrUnavailable,
	apitype.CodeInternal:             ErrInternal,
	apitype.CodePreconditionFailed:   ErrPreconditionFailed,
	apitype.CodeOldTextNotFound:      ErrOldTextNotFound,
	apitype.CodeOldTextNotUnique:     ErrOldTextNotUnique,
	apitype.CodeSandboxSetupFailed:   ErrSandboxSetupFailed,
	apitype.CodeDraining:             ErrDraining,
	apitype.CodeShellNotFound:        ErrShellNotFound,
	apitype.CodeShellBusy:            ErrShellBusy,
	apitype.CodeInvalidNetworkPolicy: ErrInvalidNetworkPolicy,
	apitype.CodePortUnreachable:      ErrPortUnreachable,
	apitype.CodeSearchLimit:          ErrSearchLimit,
	apitype.CodePatternTooComplex:    ErrPatternTooComplex,
	apitype.CodeWatchLimit:           ErrWatchLimit,
	apitype.CodeUnknownImage:         ErrUnknownImage,
	apitype.CodeImageNotReady:        ErrImageNotReady,
	apitype.CodeImageInUse:           ErrImageInUse,
	apitype.CodeSnapshotRefused:      ErrSnapshotRefused,
}

// codeByStatus names a code for error replies that carry no problem body (HEAD requests,
// proxies in between).
var codeByStatus = map[int]string{
	http.StatusBadRequest:            apitype.CodeInvalidRequest,
	http.StatusUnauthorized:          apitype.CodeUnauthorized,
	http.StatusForbidden:             apitype.CodeForbidden,
	http.StatusNotFound:              apitype.CodeNotFound,
	http.StatusGone:                  apitype.CodeLeaseExpired,
	http.StatusRequestEntityTooLarge: apitype.CodePayloadTooLarge,
	http.StatusPreconditionFailed:    apitype.CodePreconditionFailed,
	http.StatusTooManyRequests:       apitype.CodeLeaseLimit,
	http.StatusInsufficientStorage:   apitype.CodeQuotaExceeded,
	http.StatusInternalServerError:   apitype.CodeInternal,
	http.StatusBadGateway:            apitype.CodeUnavailable,
	http.StatusServiceUnavailable:    apitype.CodeUnavailable,
	http.StatusGatewayTimeout:        apitype.CodeUnavailable,
}

// APIError is an error reply of the daemon. Code is the contract's stable code; Line and
// Column locate a script error.
type APIError struct {
	Status int
	Code   string
	Title  string
	Detail string
	Line   int
	Column int
}

func (e *APIError) Error() string {
	var b strings.Builder
	b.WriteString("sidecar: ")
	if e.Title != "" {
		b.WriteString(e.Title)
	} else {
		b.WriteString(http.StatusText(e.Status))
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, " (line %d, column %d)", e.Line, e.Column)
	}
	fmt.Fprintf(&b, " [%d %s]", e.Status, e.Code)
	return b.String()
}

// Is reports whether target is the sentinel of e's code.
func (e *APIError) Is(target error) bool {
	s, ok := sentinelByCode[e.Code]
	return ok && s == target
}

// maxProblemBytes bounds how much of an error body is read: a problem is small, and a
// misbehaving proxy must not make the client buffer a large page.
const maxProblemBytes = 64 << 10

// errorFromResponse turns a non-2xx reply into an *APIError, reading at most
// maxProblemBytes of its body. It does not close the body.
func errorFromResponse(resp *http.Response) *APIError {
	e := &APIError{Status: resp.StatusCode}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblemBytes))
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	var p apitype.Problem
	if len(body) > 0 && (mt == apitype.ProblemContentType || mt == "application/json") &&
		json.Unmarshal(body, &p) == nil && p.Code != "" {
		e.Code, e.Title, e.Detail, e.Line, e.Column = p.Code, p.Title, p.Detail, p.Line, p.Column
		return e
	}
	e.Code = codeByStatus[resp.StatusCode]
	if e.Code == "" {
		e.Code = apitype.CodeInternal
		if resp.StatusCode < 500 {
			e.Code = apitype.CodeInvalidRequest
		}
	}
	e.Title = http.StatusText(resp.StatusCode)
	return e
}

// IsNotFound reports whether err says a lease, a process or a path does not exist.
func IsNotFound(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, ErrLeaseNotFound) || errors.Is(err, ErrProcessNotFound)
}

// IsLeaseGone reports whether err says the lease no longer exists or has expired: the
// caller must acquire a new one.
func IsLeaseGone(err error) bool {
	return errors.Is(err, ErrLeaseNotFound) || errors.Is(err, ErrLeaseExpired)
}

// IsUnauthorized reports whether the credential was refused (missing, wrong, or a lease
// token used outside its lease).
func IsUnauthorized(err error) bool {
	return errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrForbidden)
}

// Hints that connection errors carry, naming the setting that fixes them.
const (
	hintUnknownCA = "the daemon's certificate is signed by a CA this client does not trust: set " +
		EnvCAFile + " (Config.CAFile) to the daemon's CA certificate (the ca.crt `sidecar serve` " +
		"printed, or the one `sidecar tls gen` made)"
	hintHostname = "the daemon's certificate does not name the host in the URL: connect by a name " +
		"it lists, or add this one to SIDECAR_TLS_HOSTS on the daemon (self-signed certificates) " +
		"or to `sidecar tls gen --host/--ip`"
	hintRefused = "nothing accepts connections there: check " + EnvURL + " (Config.URL) and that the daemon runs"
)

// withHint adds to a transport error the setting that fixes it, when it is one of the
// usual ones: an untrusted CA, a certificate for another host, a refused connection. The
// error still matches what it wraps.
func withHint(err error) error {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &unknownCA):
		return fmt.Errorf("%w (%s)", err, hintUnknownCA)
	case errors.As(err, &hostname):
		return fmt.Errorf("%w (%s)", err, hintHostname)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%w (%s)", err, hintRefused)
	}
	return err
}
