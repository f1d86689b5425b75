package sidecar

import (
	"errors"
	"net/http"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/lease/image"
)

func (s *Server) handleListImages(w http.ResponseWriter, r *http.Request, _ principal) error {
	list := apitype.ImageList{Images: []apitype.ImageInfo{}, DefaultImage: lease.HostImage}
	if s.opts.Images != nil {
		list = s.opts.Images.List()
	}
	return writeJSON(w, http.StatusOK, list)
}

// handlePullImage starts a pull and answers at once, 202: GET /v1/images shows its
// progress.
func (s *Server) handlePullImage(w http.ResponseWriter, r *http.Request, _ principal) error {
	name := r.PathValue("name")
	if s.opts.Images == nil {
		return noImage(name)
	}
	in, err := s.opts.Images.Pull(name)
	if errors.Is(err, image.ErrUnknown) {
		return noImage(name)
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusAccepted, in)
}

func (s *Server) handleRemoveImage(w http.ResponseWriter, r *http.Request, _ principal) error {
	name := r.PathValue("name")
	if s.opts.Images == nil {
		return noImage(name)
	}
	err := s.opts.Images.Remove(name)
	if errors.Is(err, image.ErrUnknown) {
		return noImage(name)
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// noImage is a route's unknown image: the path names nothing (an acquire's is 400
// unknown_image instead: its body is wrong).
func noImage(name string) error {
	return errorf(http.StatusNotFound, apitype.CodeNotFound, "no image %q: the images are the operator's SIDECAR_IMAGES (GET /v1/images lists them)", name)
}

// handleSnapshot saves the lease as a new image and answers once it is ready, 201.
func (s *Server) handleSnapshot(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.activeLease(r)
	if err != nil {
		return err
	}
	var req apitype.SnapshotRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := image.CheckName(req.Name); err != nil {
		return errorf(http.StatusBadRequest, apitype.CodeInvalidRequest, "name: %v", err)
	}
	if s.opts.Images == nil {
		return errorf(http.StatusBadRequest, apitype.CodeInvalidRequest, "lease %s runs on the host's root, which a snapshot cannot hold: set SIDECAR_IMAGES and acquire on an image", l.ID)
	}
	in, err := s.opts.Images.Snapshot(r.Context(), l, req.Name)
	if err != nil {
		return err
	}
	// A release during the walk removes files under it: what was saved may lack them.
	if _, err := s.opts.Leases.Get(l.ID); err != nil {
		if rerr := s.opts.Images.Remove(in.Name); rerr != nil {
			s.log.Warn("cannot remove the snapshot of a lease released while it was saved", "image", in.Name, "lease", l.ID, "err", rerr)
		}
		return errorf(http.StatusConflict, apitype.CodeConflict, "lease %s was released while it was saved: the snapshot may be incomplete and was removed", l.ID)
	}
	return writeJSON(w, http.StatusCreated, in)
}
