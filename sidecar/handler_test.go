package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/fsxfer"
	"github.com/sidecar-sandbox/sidecar/internal/process"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/internal/script"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
)

// The handler tests drive the server through ServeHTTP on fakes of the parts it serves:
// no root, no daemon, no listener. Tokens and files are real (an fsxfer.FS on a temp
// dir); what needs the machine (processes, isolation) or a state (leases) is faked. The e2e suites test the whole.

const handlerToken = "handler-test-shared-token-0123456789abcdef"

// fakeLeases is a lease table in a map; leases never expire unless a test says so.
type fakeLeases struct {
	mu     sync.Mutex
	root   string
	leases map[string]lease.Lease
}

func (f *fakeLeases) Acquire(_ context.Context, r lease.Request) (lease.Lease, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.leases {
		if l.SessionID == r.SessionID {
			return l, false, nil
		}
	}
	id := ("l" + r.SessionID + strings.Repeat("a", 32))[:len("l")+26] // the shape lease ids have; sessions here are [a-z]
	l := lease.Lease{ID: id, SessionID: r.SessionID, Dir: filepath.Join(f.root, id), ExpiresAt: time.Now().Add(time.Hour)}
	if err := os.MkdirAll(l.Workdir(), 0o700); err != nil {
		return l, false, err
	}
	f.leases[id] = l
	return l, true, nil
}

func (f *fakeLeases) Get(id string) (lease.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[id]
	if !ok {
		return l, lease.ErrNotFound
	}
	return l, nil
}

func (f *fakeLeases) List() []lease.Lease {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []lease.Lease
	for _, l := range f.leases {
		out = append(out, l)
	}
	return out
}

func (f *fakeLeases) Touch(string) {}

func (f *fakeLeases) Retiring() int { return 0 }
func (f *fakeLeases) Spares() int   { return 0 }

func (f *fakeLeases) Renew(_ context.Context, id string, ttl time.Duration) (lease.Lease, error) {
	return f.Get(id)
}

func (f *fakeLeases) SetNetwork(_ context.Context, id string, p netpolicy.Policy) (lease.Lease, error) {
	if err := netpolicy.CheckSyntax(p); err != nil {
		return lease.Lease{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[id]
	if !ok {
		return lease.Lease{}, lease.ErrNotFound
	}
	l.Network = p
	f.leases[id] = l
	return l, nil
}

func (f *fakeLeases) Release(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.leases[id]; !ok {
		return lease.ErrNotFound
	}
	delete(f.leases, id)
	return nil
}

// fakeFiles opens a real confined filesystem on the lease's workdir.
type fakeFiles struct{}

func (fakeFiles) FS(l lease.Lease) (*fsxfer.FS, error) {
	return fsxfer.Open(fsxfer.Config{Workdir: l.Workdir(), UID: -1, GID: -1})
}

type fakeHost struct{}

func (fakeHost) Caps() sandbox.Caps { return sandbox.Caps{Isolation: "none"} }
func (fakeHost) Usage(context.Context, lease.Lease) *apitype.Usage {
	return &apitype.Usage{MemoryBytes: 4096}
}
func (fakeHost) Leftovers(lease.Lease) ([]apitype.Leftover, int) { return nil, 0 }
func (fakeHost) SignalLeftover(lease.Lease, int, syscall.Signal) error {
	return sandbox.ErrNotLeftover
}
func (fakeHost) Cleanup(context.Context) (apitype.CleanupResult, error) {
	return apitype.CleanupResult{Leases: []string{}, Cgroups: []string{}, Workdirs: []string{}, Processes: []int{}}, nil
}

// fakeProcesses has no processes: every lookup misses, and a start is refused as the
// lease's limit would refuse it.
type fakeProcesses struct{}

func (fakeProcesses) Exec(context.Context, string, process.ExecRequest) (process.ExecResult, error) {
	return process.ExecResult{}, process.ErrLimit
}
func (fakeProcesses) Start(context.Context, string, process.StartRequest) (*process.Process, bool, error) {
	return nil, false, process.ErrLimit
}
func (fakeProcesses) Get(string, string) (*process.Process, error) { return nil, process.ErrNotFound }
func (fakeProcesses) List(string) []*process.Process               { return nil }
func (fakeProcesses) Running(string) int                           { return 0 }
func (fakeProcesses) Signal(string, string, string) error          { return process.ErrNotFound }

// fakeScripts echoes the input.
type fakeScripts struct{}

func (fakeScripts) Run(_ context.Context, req script.Request) (script.Result, error) {
	return script.Result{Result: req.Input}, nil
}

// newHandlerServer is a server on fakes; mods adjust its options.
func newHandlerServer(t *testing.T, mods ...func(*ServerOptions)) *Server {
	t.Helper()
	root := t.TempDir()
	tokens, err := lease.NewTokens(root, []byte(handlerToken))
	if err != nil {
		t.Fatal(err)
	}
	opts := ServerOptions{
		Logger:       slog.New(slog.DiscardHandler),
		Version:      "handler-test",
		SharedTokens: []string{handlerToken},
		Tokens:       tokens,
		Leases:       &fakeLeases{root: root, leases: map[string]lease.Lease{}},
		Processes:    fakeProcesses{},
		Files:        fakeFiles{},
		Host:         fakeHost{},
		Limits:       HTTPLimits{MaxJSONBytes: 1024},
		HostPaths:    []string{root},
	}
	for _, m := range mods {
		m(&opts)
	}
	return NewServer(opts)
}

// do sends one request through ServeHTTP. token "" sends no credential.
func do(s *Server, method, path, token string, body io.Reader, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, body)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

// wantProblem asserts a problem+json reply with status and code, and returns its detail.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, code string) string {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != apitype.ProblemContentType {
		t.Fatalf("Content-Type %q, want %s", ct, apitype.ProblemContentType)
	}
	var p apitype.Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body: %v: %s", err, w.Body)
	}
	if p.Code != code || p.Status != status {
		t.Fatalf("problem %+v, want %d %s", p, status, code)
	}
	if strings.Contains(w.Body.String(), handlerToken) {
		t.Fatalf("problem echoes the shared token: %s", w.Body)
	}
	return p.Detail
}

// acquire takes a lease through the handler and returns it with its token.
func acquire(t *testing.T, s *Server, session string) apitype.Lease {
	t.Helper()
	w := do(s, "POST", "/v1/leases", handlerToken, strings.NewReader(`{"session_id":"`+session+`"}`), "Content-Type", "application/json")
	if w.Code != http.StatusCreated && w.Code != http.StatusOK {
		t.Fatalf("acquire: %d %s", w.Code, w.Body)
	}
	var l apitype.Lease
	if err := json.Unmarshal(w.Body.Bytes(), &l); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestHandlerAuth(t *testing.T) {
	s := newHandlerServer(t)
	l := acquire(t, s, "a")
	other := acquire(t, s, "b")
	for _, c := range []struct {
		name, method, path, token string
		status                    int
		code                      string
	}{
		{"no credential", "GET", "/v1/leases", "", 401, apitype.CodeUnauthorized},
		{"wrong shared token", "GET", "/v1/leases", strings.Repeat("x", 42), 401, apitype.CodeUnauthorized},
		{"forged lease token", "GET", "/v1/leases/" + l.ID, "a.forged.token", 401, apitype.CodeUnauthorized},
		{"token in the query", "GET", "/v1/leases?access_token=" + handlerToken, handlerToken, 401, apitype.CodeUnauthorized},
		{"lease token on a shared-only route", "GET", "/v1/leases", l.Token, 403, apitype.CodeForbidden},
		{"lease token for another lease", "GET", "/v1/leases/" + other.ID, l.Token, 403, apitype.CodeForbidden},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantProblem(t, do(s, c.method, c.path, c.token, nil), c.status, c.code)
		})
	}
	if w := do(s, "GET", "/v1/leases/"+l.ID, l.Token, nil); w.Code != http.StatusOK {
		t.Fatalf("own lease with its token: %d %s", w.Code, w.Body)
	}
	if w := do(s, "GET", "/healthz", "", nil); w.Code != http.StatusOK || w.Body.String() != "ok\n" {
		t.Fatalf("healthz without credential: %d %q", w.Code, w.Body)
	}
}

func TestHandlerOrigin(t *testing.T) {
	s := newHandlerServer(t, func(o *ServerOptions) { o.AllowedOrigins = []string{"https://console.example/"} })
	wantProblem(t, do(s, "GET", "/v1/info", handlerToken, nil, "Origin", "https://evil.example"), 403, apitype.CodeForbidden)
	if w := do(s, "GET", "/v1/info", handlerToken, nil, "Origin", "https://console.example"); w.Code != http.StatusOK {
		t.Fatalf("listed origin: %d %s", w.Code, w.Body)
	}
}

func TestHandlerAcquireReplies(t *testing.T) {
	s := newHandlerServer(t)
	body := `{"session_id":"sone","ttl_seconds":60}`
	w := do(s, "POST", "/v1/leases", handlerToken, strings.NewReader(body), "Content-Type", "application/json")
	if w.Code != http.StatusCreated {
		t.Fatalf("first acquire: %d %s", w.Code, w.Body)
	}
	if ct, cc := w.Header().Get("Content-Type"), w.Header().Get("Cache-Control"); ct != "application/json" || cc != "no-store" {
		t.Fatalf("headers Content-Type %q Cache-Control %q", ct, cc)
	}
	var l apitype.Lease
	if err := json.Unmarshal(w.Body.Bytes(), &l); err != nil {
		t.Fatal(err)
	}
	// Created now: nothing has run in it, so no usage is read.
	if l.Token == "" || l.State != apitype.LeaseActive || l.Usage != nil {
		t.Fatalf("lease %+v: want a token, active, no usage", l)
	}
	w = do(s, "POST", "/v1/leases", handlerToken, strings.NewReader(body))
	if w.Code != http.StatusOK {
		t.Fatalf("same session again: %d, want 200", w.Code)
	}
	var again apitype.Lease
	if err := json.Unmarshal(w.Body.Bytes(), &again); err != nil {
		t.Fatal(err)
	}
	if again.ID != l.ID || again.Token == "" || again.Usage == nil || again.Usage.MemoryBytes != 4096 {
		t.Fatalf("same session again: %+v, want the lease with a token and the host's usage", again)
	}
	wantProblem(t, do(s, "GET", "/v1/leases/nope", handlerToken, nil), 404, apitype.CodeLeaseNotFound)
	if w := do(s, "DELETE", "/v1/leases/"+l.ID, handlerToken, nil); w.Code != http.StatusNoContent {
		t.Fatalf("release: %d %s", w.Code, w.Body)
	}
	wantProblem(t, do(s, "DELETE", "/v1/leases/"+l.ID, handlerToken, nil), 404, apitype.CodeLeaseNotFound)
}

// Bad bodies are refused before any part is called, with invalid_request or
// payload_too_large, never a 5xx.
func TestHandlerBadInput(t *testing.T) {
	s := newHandlerServer(t)
	l := acquire(t, s, "bad")
	json := "application/json"
	for _, c := range []struct {
		name, path, contentType, body string
		status                        int
		code                          string
	}{
		{"over the body limit", "/v1/leases", json, `{"session_id":"` + strings.Repeat("x", 2000) + `"}`, 413, apitype.CodePayloadTooLarge},
		{"not JSON", "/v1/leases", "text/plain", `{}`, 400, apitype.CodeInvalidRequest},
		{"unknown field", "/v1/leases", json, `{"sesion_id":"x"}`, 400, apitype.CodeInvalidRequest},
		{"trailing data", "/v1/leases", json, `{} {}`, 400, apitype.CodeInvalidRequest},
		{"negative ttl", "/v1/leases", json, `{"ttl_seconds":-1}`, 400, apitype.CodeInvalidRequest},
		{"negative renew", "/v1/leases/" + l.ID + "/renew", json, `{"ttl_seconds":-5}`, 400, apitype.CodeInvalidRequest},
		{"bad signal body", "/v1/leases/" + l.ID + "/processes/p1/signal", json, `{"signal":1}`, 400, apitype.CodeInvalidRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantProblem(t, do(s, "POST", c.path, handlerToken, strings.NewReader(c.body), "Content-Type", c.contentType), c.status, c.code)
		})
	}
}

// What the parts refuse maps to its problem code.
func TestHandlerPartErrors(t *testing.T) {
	s := newHandlerServer(t)
	l := acquire(t, s, "parts")
	wantProblem(t, do(s, "GET", "/v1/leases/"+l.ID+"/processes/p1", l.Token, nil), 404, apitype.CodeProcessNotFound)
	wantProblem(t, do(s, "POST", "/v1/leases/"+l.ID+"/processes", l.Token, strings.NewReader(`{"argv":["sleep","1"]}`)), 429, apitype.CodeLeaseLimit)
	wantProblem(t, do(s, "GET", "/v1/leases/nope/processes", handlerToken, nil), 404, apitype.CodeLeaseNotFound)
}

func TestHandlerUnrouted(t *testing.T) {
	s := newHandlerServer(t)
	w := do(s, "PUT", "/v1/leases", handlerToken, nil)
	wantProblem(t, w, 405, apitype.CodeMethodNotAllowed)
	if allow := w.Header().Get("Allow"); allow != "GET, HEAD, POST" {
		t.Fatalf("Allow %q, want GET, HEAD, POST", allow)
	}
	wantProblem(t, do(s, "GET", "/v2/anything", handlerToken, nil), 404, apitype.CodeNotFound)
}

func TestHandlerFiles(t *testing.T) {
	s := newHandlerServer(t)
	l := acquire(t, s, "files")
	base := "/v1/leases/" + l.ID + "/files/"
	w := do(s, "PUT", base+"a.txt", l.Token, strings.NewReader("hello"))
	if w.Code != http.StatusCreated || w.Header().Get("ETag") == "" {
		t.Fatalf("put: %d ETag %q %s", w.Code, w.Header().Get("ETag"), w.Body)
	}
	w = do(s, "GET", base+"a.txt", l.Token, nil)
	if w.Code != http.StatusOK || w.Body.String() != "hello" {
		t.Fatalf("get: %d %q", w.Code, w.Body)
	}
	if w = do(s, "GET", base+"a.txt", l.Token, nil, "Range", "bytes=1-2"); w.Code != http.StatusPartialContent || w.Body.String() != "el" {
		t.Fatalf("range: %d %q", w.Code, w.Body)
	}
	wantProblem(t, do(s, "PUT", base+"a.txt", l.Token, strings.NewReader("x"), "If-None-Match", "*"), 412, apitype.CodePreconditionFailed)
	wantProblem(t, do(s, "GET", base+"missing", l.Token, nil), 404, apitype.CodeNotFound)
	// The reply names neither the lease directory nor anything above it.
	detail := wantProblem(t, do(s, "GET", base+"..%2F..%2Fetc%2Fpasswd", l.Token, nil), 400, apitype.CodePathOutsideWorkdir)
	if strings.Contains(detail, s.opts.HostPaths[0]) {
		t.Fatalf("detail shows a host path: %s", detail)
	}
}

func TestHandlerScripts(t *testing.T) {
	off := newHandlerServer(t)
	body := `{"source":"function transform(i){return i}","input":{"n":1}}`
	wantProblem(t, do(off, "POST", "/v1/scripts/run", handlerToken, strings.NewReader(body)), 404, apitype.CodeCapabilityDisabled)

	on := newHandlerServer(t, func(o *ServerOptions) { o.Scripts = fakeScripts{} })
	w := do(on, "POST", "/v1/scripts/run", handlerToken, strings.NewReader(body))
	if w.Code != http.StatusOK {
		t.Fatalf("script: %d %s", w.Code, w.Body)
	}
	var res apitype.ScriptResult
	err := json.Unmarshal(w.Body.Bytes(), &res)
	if got, _ := json.Marshal(res.Result); err != nil || string(got) != `{"n":1}` || res.Logs == nil {
		t.Fatalf("script result %+v (%v): want the input back and logs [] not null", res, err)
	}
	wantProblem(t, do(on, "POST", "/v1/scripts/run", handlerToken, strings.NewReader(`{"source":""}`)), 400, apitype.CodeInvalidRequest)
	wantProblem(t, do(on, "POST", "/v1/scripts/run", handlerToken, strings.NewReader(`{"source":"x","timeout_ms":-1}`)), 400, apitype.CodeInvalidRequest)
}

// callerScripts records whose script it was asked to run and refuses busy ones.
type callerScripts struct{ leases chan string }

func (c callerScripts) Run(_ context.Context, req script.Request) (script.Result, error) {
	c.leases <- req.Lease
	if req.Source == "busy" {
		return script.Result{}, fmt.Errorf("%w: no worker came free within 35s", script.ErrBusy)
	}
	return script.Result{Result: req.Input}, nil
}

// The runner learns which lease asked (the shared token: none), so that callers take
// turns and a lease holds a share of the workers; no free worker in time is a 503.
func TestHandlerScriptsCaller(t *testing.T) {
	sc := callerScripts{leases: make(chan string, 3)}
	s := newHandlerServer(t, func(o *ServerOptions) { o.Scripts = sc })
	l := acquire(t, s, "scripts")
	body := `{"source":"function transform(i){return i}","input":1}`
	if w := do(s, "POST", "/v1/scripts/run", l.Token, strings.NewReader(body)); w.Code != http.StatusOK {
		t.Fatalf("lease token: %d %s", w.Code, w.Body)
	}
	if got := <-sc.leases; got != l.ID {
		t.Errorf("lease token's script ran as caller %q, want %q", got, l.ID)
	}
	if w := do(s, "POST", "/v1/scripts/run", handlerToken, strings.NewReader(body)); w.Code != http.StatusOK {
		t.Fatalf("shared token: %d %s", w.Code, w.Body)
	}
	if got := <-sc.leases; got != "" {
		t.Errorf("shared token's script ran as caller %q, want none", got)
	}
	wantProblem(t, do(s, "POST", "/v1/scripts/run", l.Token, strings.NewReader(`{"source":"busy"}`)), 503, apitype.CodeUnavailable)
}

func TestHandlerInfo(t *testing.T) {
	notAfter := time.Date(2031, 2, 3, 4, 5, 6, 0, time.UTC)
	s := newHandlerServer(t, func(o *ServerOptions) {
		o.Info.Limits.MaxLeases = 7
		o.CertNotAfter = func() time.Time { return notAfter }
	})
	l := acquire(t, s, "info")
	w := do(s, "GET", "/v1/info", l.Token, nil)
	if w.Code != http.StatusOK {
		t.Fatalf("info with a lease token: %d %s", w.Code, w.Body)
	}
	var info apitype.Info
	if err := json.Unmarshal(w.Body.Bytes(), &info); err != nil {
		t.Fatal(err)
	}
	if info.Version != "handler-test" || info.APIVersion != apitype.APIVersion || info.Limits.MaxLeases != 7 ||
		info.Capabilities.Isolation != "none" || info.Capabilities.Scripts || !info.Capabilities.Files {
		t.Fatalf("info %+v", info)
	}
	if info.CertNotAfter == nil || !info.CertNotAfter.Equal(notAfter) {
		t.Fatalf("cert_not_after %v, want %v", info.CertNotAfter, notAfter)
	}
}
