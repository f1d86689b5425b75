package client

import (
	"context"
	"net/http"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Shell is a persistent shell session of a lease: cd, export and background jobs carry
// from one Run to the next (docs/api.md, Shell sessions).
type Shell struct {
	l  *Lease
	id string
}

// NewShell starts a shell session (bash when the lease has it, else sh; req.Shell picks
// one). It is never retried: a lost reply must not start two shells.
func (l *Lease) NewShell(ctx context.Context, req apitype.ShellCreateRequest) (*Shell, apitype.Shell, error) {
	var st apitype.Shell
	if err := l.c.doJSON(ctx, request{method: http.MethodPost, path: leasePath(l.id, "shells"), json: req, lease: l}, &st); err != nil {
		return nil, st, err
	}
	return &Shell{l: l, id: st.ID}, st, nil
}

// Shell is a handle on an existing session of the lease; nothing is sent.
func (l *Lease) Shell(id string) *Shell { return &Shell{l: l, id: id} }

// Shells lists the lease's shell sessions, oldest first.
func (l *Lease) Shells(ctx context.Context) ([]apitype.Shell, error) {
	var list apitype.ShellList
	err := l.c.doJSON(ctx, request{method: http.MethodGet, path: leasePath(l.id, "shells"), lease: l, idempotent: true}, &list)
	return list.Shells, err
}

// ID is the session's id (also its shell's process id).
func (s *Shell) ID() string { return s.id }

// Run runs one command in the session; timeout 0 is none. ErrShellBusy while another
// command runs in it; a result with Ended set means the shell exited and the session is
// gone. It is never retried: a lost reply must not run the command twice.
func (s *Shell) Run(ctx context.Context, command string, timeout time.Duration) (apitype.ShellResult, error) {
	var res apitype.ShellResult
	err := s.l.c.doJSON(ctx, request{method: http.MethodPost, path: leasePath(s.l.id, "shells", escapeID(s.id), "run"),
		json: apitype.ShellRunRequest{Command: command, TimeoutSeconds: timeout.Seconds()}, lease: s.l}, &res)
	return res, err
}

// Status returns the session's state: cwd, busy, last exit code.
func (s *Shell) Status(ctx context.Context) (apitype.Shell, error) {
	var st apitype.Shell
	err := s.l.c.doJSON(ctx, request{method: http.MethodGet, path: leasePath(s.l.id, "shells", escapeID(s.id)), lease: s.l, idempotent: true}, &st)
	return st, err
}

// Close kills the session's shell and what it runs.
func (s *Shell) Close(ctx context.Context) error {
	return s.l.c.doJSON(ctx, request{method: http.MethodDelete, path: leasePath(s.l.id, "shells", escapeID(s.id)), lease: s.l, idempotent: true}, nil)
}
