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
