package sidecar

import (
	"context"
	"net/http"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/shell"
	"github.com/sidecar-sandbox/sidecar/lease"
)

// Shells keeps the lease's persistent shell sessions (shell.Manager).
type Shells interface {
	Create(ctx context.Context, leaseID string, r shell.CreateRequest) (*shell.Session, error)
	Get(leaseID, id string) (*shell.Session, error)
	List(leaseID string) []*shell.Session
	Close(leaseID, id string) error
}

// leaseShells is the request's active lease and the configured Shells (capability_disabled
// for a server built without).
func (s *Server) leaseShells(r *http.Request) (lease.Lease, Shells, error) {
	l, err := s.activeLease(r)
	if err != nil {
		return l, nil, err
	}
	if s.opts.Shells == nil {
		return l, nil, errorf(http.StatusNotFound, apitype.CodeCapabilityDisabled, "shell sessions are not enabled on this daemon")
	}
	return l, s.opts.Shells, nil
}

func (s *Server) handleCreateShell(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, shells, err := s.leaseShells(r)
	if err != nil {
		return err
	}
	var req apitype.ShellCreateRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	sess, err := shells.Create(r.Context(), l.ID, shell.CreateRequest{Shell: req.Shell, Env: req.Env, Cwd: req.Cwd})
	s.metrics.procStart("shell", err)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, sess.Status())
}

func (s *Server) handleListShells(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, shells, err := s.leaseShells(r)
	if err != nil {
		return err
	}
	list := shells.List(l.ID)
	out := apitype.ShellList{Shells: make([]apitype.Shell, 0, len(list))}
	for _, sess := range list {
		out.Shells = append(out.Shells, sess.Status())
	}
	return writeJSON(w, http.StatusOK, out)
}

// session is the {sid} of the request's lease.
func (s *Server) session(r *http.Request) (*shell.Session, error) {
	l, shells, err := s.leaseShells(r)
	if err != nil {
		return nil, err
	}
	return shells.Get(l.ID, r.PathValue("sid"))
}

func (s *Server) handleGetShell(w http.ResponseWriter, r *http.Request, _ principal) error {
	sess, err := s.session(r)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sess.Status())
}

func (s *Server) handleRunShell(w http.ResponseWriter, r *http.Request, _ principal) error {
	sess, err := s.session(r)
	if err != nil {
		return err
	}
	var req apitype.ShellRunRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	_, err = sess.Run(r.Context(), shell.RunRequest{
		Command: req.Command, Timeout: seconds(req.TimeoutSeconds), OutputHeadBytes: req.OutputHeadBytes,
		// Written while the output still holds its share of the daemon's output budget,
		// and streamed, as an exec's: never whole in memory.
		Reply: func(res shell.Result) error { return writeShellResult(w, res) },
	})
	return err
}

func (s *Server) handleCloseShell(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, shells, err := s.leaseShells(r)
	if err != nil {
		return err
	}
	if err := shells.Close(l.ID, r.PathValue("sid")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
