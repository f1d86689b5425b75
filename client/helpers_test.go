package client

import (
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

const testToken = "test-shared-token-0123456789abcdefghijkl"

// fastRetry keeps retry tests quick without changing what is retried.
var fastRetry = retryPolicy{attempts: 3, base: time.Millisecond, max: 5 * time.Millisecond}

// newTestClient serves h over TLS on loopback and returns a client trusting it.
func newTestClient(t testing.TB, h http.Handler) (*Client, *httptest.Server) {
	t.Helper()
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	c, err := New(Config{URL: srv.URL, Token: testToken, HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	c.retry = fastRetry
	c.reconn = retryPolicy{attempts: 4, base: time.Millisecond, max: 5 * time.Millisecond}
	return c, srv
}

// productionClient starts srv with TLS and returns a client that trusts it by a CA file,
// as a deployment's client does (New's own transports, not the test server's).
func productionClient(t testing.TB, srv *httptest.Server, mods ...func(*Config)) *Client {
	t.Helper()
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{URL: srv.URL, Token: testToken, CAFile: ca}
	for _, m := range mods {
		m(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writeProblem answers like the daemon's one error function.
func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", apitype.ProblemContentType)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apitype.Problem{Type: apitype.ProblemTypePrefix + code,
		Title: http.StatusText(status), Status: status, Detail: detail, Code: code})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// requireAuth checks the bearer credential like the daemon does.
func requireAuth(t *testing.T, r *http.Request, want string) bool {
	t.Helper()
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || got != want {
		t.Errorf("%s %s: credential %q, want %q", r.Method, r.URL.Path, got, want)
		return false
	}
	return true
}

// dropConnection cuts the TCP connection without an HTTP response.
func dropConnection(t *testing.T, w http.ResponseWriter) {
	t.Helper()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Fatalf("hijack: %v", err)
	}
	conn.Close()
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testtool.WaitFor(t, what, 5*time.Second, cond)
}

// roundTripFunc is a RoundTripper of one function, as a tracing wrapper would be.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
