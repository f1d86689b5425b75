package sidecar

import (
	"net/http"
	"strings"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// routes is the whole API surface in one place (see docs/api.md).
func (s *Server) routes() {
	s.route("GET /healthz", public, s.handleHealthz)
	s.route("GET /readyz", public, s.handleReadyz)
	s.route("GET /v1/openapi.yaml", public, s.handleOpenAPI)
	s.route("GET /v1/info", anyCred, s.handleInfo)
	s.route("GET /metrics", sharedOnly, s.handleMetrics)

	s.route("POST /v1/leases", sharedOnly, s.handleAcquire)
	s.route("GET /v1/leases", sharedOnly, s.handleListLeases)
	s.route("GET /v1/leases/{id}", leaseScope, s.handleGetLease)
	s.route("POST /v1/leases/{id}/renew", leaseScope, s.handleRenew)
	s.route("DELETE /v1/leases/{id}", leaseScope, s.handleRelease)
	s.route("GET /v1/leases/{id}/usage", leaseScope, s.handleUsage)
	s.route("POST /v1/cleanup", sharedOnly, s.handleCleanup)
	s.route("POST /v1/drain", sharedOnly, s.handleDrain)
	s.route("DELETE /v1/drain", sharedOnly, s.handleDrain)

	s.route("POST /v1/leases/{id}/exec", leaseScope, s.handleExec)
	s.route("GET /v1/leases/{id}/exec", leaseScope, s.handleExecStream)
	s.route("POST /v1/leases/{id}/processes", leaseScope, s.handleStart)
	s.route("GET /v1/leases/{id}/processes", leaseScope, s.handleListProcesses)
	s.route("GET /v1/leases/{id}/processes/{pid}", leaseScope, s.handleGetProcess)
	s.route("POST /v1/leases/{id}/processes/{pid}/signal", leaseScope, s.handleSignal)
	s.route("GET /v1/leases/{id}/processes/{pid}/attach", leaseScope, s.handleAttach)
	s.route("POST /v1/leases/{id}/leftovers/{pid}/signal", leaseScope, s.handleSignalLeftover)

	s.route("POST /v1/leases/{id}/shells", leaseScope, s.handleCreateShell)
	s.route("GET /v1/leases/{id}/shells", leaseScope, s.handleListShells)
	s.route("GET /v1/leases/{id}/shells/{sid}", leaseScope, s.handleGetShell)
	s.route("POST /v1/leases/{id}/shells/{sid}/run", leaseScope, s.handleRunShell)
	s.route("DELETE /v1/leases/{id}/shells/{sid}", leaseScope, s.handleCloseShell)

	s.route("PUT /v1/leases/{id}/files/{path...}", leaseScope, s.handlePutFile)
	s.route("PATCH /v1/leases/{id}/files/{path...}", leaseScope, s.handlePatchFile)
	s.route("GET /v1/leases/{id}/files/{path...}", leaseScope, s.handleGetFile)
	s.route("HEAD /v1/leases/{id}/files/{path...}", leaseScope, s.handleHeadFile)
	s.route("DELETE /v1/leases/{id}/files/{path...}", leaseScope, s.handleDeleteFile)
	s.route("POST /v1/leases/{id}/files/{path...}", leaseScope, s.handleFileOp)
	s.route("PUT /v1/leases/{id}/archive/{path...}", leaseScope, s.handlePutArchive)
	s.route("GET /v1/leases/{id}/archive/{path...}", leaseScope, s.handleGetArchive)
	s.route("GET /v1/leases/{id}/find/{path...}", leaseScope, s.handleFind)
	s.route("GET /v1/leases/{id}/grep/{path...}", leaseScope, s.handleGrep)
	s.route("GET /v1/leases/{id}/stat/{path...}", leaseScope, s.handleStat)
	s.route("GET /v1/leases/{id}/watch/{path...}", leaseScope, s.handleWatch)

	s.route("PUT /v1/leases/{id}/network", sharedOnly, s.handleSetNetwork)
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		s.route(m+" /v1/leases/{id}/ports/{port}/{path...}", leaseScope, s.handlePorts)
	}
	s.route("GET /v1/leases/{id}/port-forward/{port}", leaseScope, s.handlePortForward)

	s.route("GET /v1/images", sharedOnly, s.handleListImages)
	s.route("POST /v1/images/{name}/pull", sharedOnly, s.handlePullImage)
	s.route("DELETE /v1/images/{name}", sharedOnly, s.handleRemoveImage)
	s.route("POST /v1/leases/{id}/snapshot", leaseScope, s.handleSnapshot)

	s.route("POST /v1/scripts/run", anyCred, s.handleScript)

	if s.console != nil {
		s.mux.Handle("/ui/", s.console)
		s.mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	}

	// The catch-all matches only what no route above does, so a routed request is
	// looked up once.
	s.mux.HandleFunc("/", s.unrouted)
}

// unrouted answers what the mux has no handler for as problem+json instead of the mux's
// plain text: 405 with Allow when the path exists under other methods, else 404.
func (s *Server) unrouted(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		s.writeError(w, r, errorf(http.StatusMethodNotAllowed, apitype.CodeMethodNotAllowed, "%s is not allowed here; allowed: %s", r.Method, strings.Join(allow, ", ")))
		return
	}
	s.writeError(w, r, errorf(http.StatusNotFound, apitype.CodeNotFound, "no route for %s %s", r.Method, r.URL.Path))
}
