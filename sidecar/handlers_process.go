package sidecar

import (
	"context"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/process"
)

// seconds converts timeout_seconds and idle_timeout_seconds; package process bounds them
// (clamped here so that no float overflows a Duration: 1e9 s is far beyond the bound, and
// NaN, which a query string can say, is refused as negative).
func seconds(v float64) time.Duration {
	if math.IsNaN(v) {
		return -1
	}
	return time.Duration(min(v, 1e9) * float64(time.Second))
}

// startRequest is a start's wire form in package process's terms, which checks it.
func startRequest(req apitype.StartRequest) process.StartRequest {
	return process.StartRequest{
		ID:          req.ID,
		Spec:        process.Spec{Argv: req.Argv, Env: req.Env, Dir: req.Cwd, TTY: req.TTY},
		Rows:        req.Rows,
		Cols:        req.Cols,
		Timeout:     seconds(req.TimeoutSeconds),
		IdleTimeout: seconds(req.IdleTimeoutSeconds),
		Stdin:       req.Stdin || req.TTY,

		KillLeftovers: req.KillLeftovers,
		Lossless:      req.Lossless,
	}
}

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.activeLease(r)
	if err != nil {
		return err
	}
	var req apitype.ExecRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	var stdin io.Reader
	if req.Stdin != nil {
		stdin = strings.NewReader(*req.Stdin)
	}
	replied := false
	_, err = s.opts.Processes.Exec(r.Context(), l.ID, process.ExecRequest{
		Spec:        process.Spec{Argv: req.Argv, Env: req.Env, Dir: req.Cwd},
		Stdin:       stdin,
		Timeout:     seconds(req.TimeoutSeconds),
		IdleTimeout: seconds(req.IdleTimeoutSeconds),

		KillLeftovers:   req.KillLeftovers,
		OutputHeadBytes: req.OutputHeadBytes,
		// Written while the exec still holds its slot and its share of the output
		// budget, so a client that reads its reply slowly stays within both.
		Reply: func(res process.ExecResult) error { replied = true; return writeExecResult(w, res) },
	})
	if replied {
		s.metrics.procStart("exec", nil) // the run went well; err is the reply's
	} else {
		s.metrics.procStart("exec", err)
	}
	return err
}

func (s *Server) handleStart(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.activeLease(r)
	if err != nil {
		return err
	}
	var req apitype.StartRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	// The process belongs to the lease, not to this request.
	p, created, err := s.opts.Processes.Start(context.WithoutCancel(r.Context()), l.ID, startRequest(req))
	if created || err != nil {
		s.metrics.procStart("background", err)
	}
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return writeJSON(w, status, p.Status())
}

func (s *Server) handleListProcesses(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.activeLease(r)
	if err != nil {
		return err
	}
	procs := s.opts.Processes.List(l.ID)
	out := apitype.ProcessList{Processes: make([]apitype.Process, 0, len(procs))}
	for _, p := range procs {
		out.Processes = append(out.Processes, p.Status())
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleGetProcess(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.activeLease(r)
	if err != nil {
		return err
	}
	p, err := s.opts.Processes.Get(l.ID, r.PathValue("pid"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, p.Status())
}

func (s *Server) handleSignal(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.activeLease(r)
	if err != nil {
		return err
	}
	var req apitype.SignalRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	if err := s.opts.Processes.Signal(l.ID, r.PathValue("pid"), req.Signal); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// handleSignalLeftover signals one process a finished command left in the lease: only
// a leftover of this lease, which the sandbox checks through a pidfd (no recycled pid).
func (s *Server) handleSignalLeftover(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.activeLease(r)
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return errorf(http.StatusNotFound, apitype.CodeProcessNotFound, "a leftover's pid is a positive number")
	}
	var req apitype.SignalRequest
	if err := s.decodeJSON(w, r, &req); err != nil {
		return err
	}
	sig, err := process.ParseSignal(req.Signal)
	if err != nil {
		return err
	}
	if err := s.opts.Host.SignalLeftover(l, pid, sig); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// handleAttach streams a running or finished process's output from ?since=N and feeds
// its stdin, over a v5.channel.k8s.io websocket.
func (s *Server) handleAttach(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.activeLease(r)
	if err != nil {
		return err
	}
	p, err := s.opts.Processes.Get(l.ID, r.PathValue("pid"))
	if err != nil {
		return err
	}
	since := int64(0)
	if v := r.URL.Query().Get("since"); v != "" {
		since, err = strconv.ParseInt(v, 10, 64)
		if err != nil || since < -1 {
			return badRequest("since must be an output offset (or -1 for live output only)")
		}
	}
	lossless, err := queryLossless(r)
	if err != nil {
		return err
	}
	proto, err := streamProtocol(r)
	if err != nil {
		return err
	}
	subscribe := p.Subscribe
	if lossless {
		subscribe = p.SubscribeLossless
	}
	sub, err := subscribe(since)
	if err != nil {
		return err
	}
	h := http.Header{}
	h.Set(apitype.HeaderOutputOffset, strconv.FormatInt(sub.Offset(), 10))
	h.Set(apitype.HeaderBytesLost, strconv.FormatInt(sub.Lost(), 10))
	h.Set(apitype.HeaderOutputMode, outputMode(sub))
	return s.stream(w, r, proto, h, p, sub, false)
}

// queryLossless reads ?lossless=, which asks for a viewer the process waits for.
func queryLossless(r *http.Request) (bool, error) {
	v := r.URL.Query().Get("lossless")
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, badRequest("lossless must be a boolean (1 or 0)")
	}
	return b, nil
}

func outputMode(sub *process.Subscription) string {
	if sub.Lossless() {
		return apitype.OutputModeLossless
	}
	return apitype.OutputModeLossy
}

// handleExecStream starts a process and attaches to it in one round trip (what `sidecar
// shell` uses). Closing the websocket kills the process unless ?detach=1.
func (s *Server) handleExecStream(w http.ResponseWriter, r *http.Request, _ principal) error {
	l, err := s.activeLease(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	req := apitype.StartRequest{
		Argv:  q["command"],
		Cwd:   q.Get("cwd"),
		TTY:   queryBool(q.Get("tty")),
		Stdin: queryBool(q.Get("stdin")),

		KillLeftovers: queryBool(q.Get("kill_leftovers")),
	}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return badRequest("env must be KEY=VALUE")
		}
		if req.Env == nil {
			req.Env = map[string]string{}
		}
		req.Env[k] = v
	}
	for name, dst := range map[string]*uint16{"rows": &req.Rows, "cols": &req.Cols} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return badRequest("%s must be a small positive integer", name)
			}
			*dst = uint16(n)
		}
	}
	for name, dst := range map[string]*float64{"timeout_seconds": &req.TimeoutSeconds, "idle_timeout_seconds": &req.IdleTimeoutSeconds} {
		if v := q.Get(name); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return badRequest("%s must be a number", name)
			}
			*dst = f
		}
	}
	detach := queryBool(q.Get("detach"))
	// Everything that can be refused is checked before anything is started.
	if req.Lossless, err = queryLossless(r); err != nil {
		return err
	}
	proto, err := streamProtocol(r)
	if err != nil {
		return err
	}
	p, _, err := s.opts.Processes.Start(context.WithoutCancel(r.Context()), l.ID, startRequest(req))
	s.metrics.procStart("background", err)
	if err != nil {
		return err
	}
	// Lossless: the process has held its output since its first byte; this takes over.
	subscribe := p.Subscribe
	if req.Lossless {
		subscribe = p.SubscribeLossless
	}
	sub, err := subscribe(0)
	if err != nil {
		_ = p.Kill()
		return err
	}
	h := http.Header{}
	h.Set(apitype.HeaderProcessID, p.ID())
	h.Set(apitype.HeaderOutputOffset, "0")
	h.Set(apitype.HeaderBytesLost, "0")
	h.Set(apitype.HeaderOutputMode, outputMode(sub))
	return s.stream(w, r, proto, h, p, sub, !detach)
}

func queryBool(v string) bool {
	b, _ := strconv.ParseBool(v)
	return b || v == "yes"
}

// procStart counts process starts by kind and result.
func (m *metrics) procStart(kind string, err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	}
	m.procStarts.WithLabelValues(kind, result).Inc()
}
