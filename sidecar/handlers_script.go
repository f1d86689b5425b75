package sidecar

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/sidecar/script"
)

// scriptQueueWait is how long a script may wait for a worker beyond its own run time.
const scriptQueueWait = 5 * time.Second

// scriptBody is apitype.ScriptRequest with the input kept as raw JSON: it goes to the
// worker as it came.
type scriptBody struct {
	Source      string          `json:"source"`
	Input       json.RawMessage `json:"input"`
	TimeoutMS   int64           `json:"timeout_ms"`
	MemoryBytes int64           `json:"memory_bytes"`
}

func (s *Server) handleScript(w http.ResponseWriter, r *http.Request, _ principal) error {
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
	// Run waits for a free worker as long as its context allows: bound the wait so a
	// saturated pool answers 503 rather than holding connections forever.
	ctx, cancel := context.WithTimeout(r.Context(), script.DefaultMaxTimeout+scriptQueueWait)
	defer cancel()
	res, err := s.opts.Scripts.Run(ctx, script.Request{
		Source:      req.Source,
		Input:       req.Input,
		Timeout:     time.Duration(req.TimeoutMS) * time.Millisecond,
		MemoryBytes: req.MemoryBytes,
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
