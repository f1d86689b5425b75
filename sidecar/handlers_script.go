package sidecar

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/script"
)

// scriptBody is apitype.ScriptRequest with the input kept as raw JSON: it goes to the
// worker as it came.
type scriptBody struct {
	Source      string          `json:"source"`
	Input       json.RawMessage `json:"input"`
	TimeoutMS   int64           `json:"timeout_ms"`
	MemoryBytes int64           `json:"memory_bytes"`
}

func (s *Server) handleScript(w http.ResponseWriter, r *http.Request, p principal) error {
	if s.opts.Scripts == nil {
		return errorf(http.StatusNotFound, apitype.CodeCapabilityDisabled, "scripts are disabled on this daemon (SCRIPT_ENABLED=false)")
	}
	var req scriptBody
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Source == "" {
		return badRequest("source must define function transform(input)")
	}
	if req.TimeoutMS < 0 || req.MemoryBytes < 0 {
		return badRequest("timeout_ms and memory_bytes must not be negative")
	}
	if len(req.Input) == 0 {
		req.Input = json.RawMessage("null")
	}
	// Run bounds the wait for a worker itself (503 when none comes free in time) and
	// starts the script's timeout only once it runs; the lease's scripts take turns with
	// other callers' and hold at most a share of the workers.
	res, err := s.opts.Scripts.Run(r.Context(), script.Request{
		Source:      req.Source,
		Input:       req.Input,
		Timeout:     time.Duration(req.TimeoutMS) * time.Millisecond,
		MemoryBytes: req.MemoryBytes,
		Lease:       p.leaseID,
	})
	if err != nil {
		return err
	}
	logs := res.Logs
	if logs == nil {
		logs = []string{}
	}
	return writeJSON(w, http.StatusOK, apitype.ScriptResult{Result: res.Result, Logs: logs, DurationMS: res.Duration.Milliseconds()})
}
