package sidecar

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/sidecar/console"
)

// httptest requests are for Host example.com: this is the daemon's own origin there.
const selfOrigin = "https://example.com"

// newConsoleServer is a handler server with the console on and a clock the test moves.
func newConsoleServer(t *testing.T) (*Server, *atomic.Int64) {
	t.Helper()
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	s := newHandlerServer(t, func(o *ServerOptions) {
		o.Console = true
		o.Now = func() time.Time { return time.Unix(0, now.Load()) }
	})
	return s, &now
}

// signIn posts the token to /ui/session with hdr and returns the reply.
func signIn(s *Server, token string, hdr ...string) *httptest.ResponseRecorder {
	return do(s, "POST", "/ui/session", "", strings.NewReader(`{"token":"`+token+`"}`), hdr...)
}

// sessionCookie signs in the way the console does and returns the cookie.
func sessionCookie(t *testing.T, s *Server) *http.Cookie {
	t.Helper()
	w := signIn(s, handlerToken, "Origin", selfOrigin, console.CSRFHeader, "1")
	if w.Code != http.StatusNoContent {
		t.Fatalf("sign-in: %d %s", w.Code, w.Body)
	}
	for _, c := range w.Result().Cookies() {
		if c.Name == console.CookieName {
			return c
		}
	}
	t.Fatalf("sign-in set no %s cookie: %q", console.CookieName, w.Header().Values("Set-Cookie"))
	return nil
}

// withCookie sends one request with the session cookie and the given headers.
func withCookie(s *Server, c *http.Cookie, method, path, body string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.AddCookie(c)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

func TestConsoleOffServesNothing(t *testing.T) {
	s := newHandlerServer(t)
	for _, p := range []string{"/ui/", "/ui/app.js", "/ui/index.html"} {
		wantProblem(t, do(s, "GET", p, "", nil), http.StatusNotFound, apitype.CodeNotFound)
	}
	wantProblem(t, signIn(s, handlerToken, "Origin", selfOrigin, console.CSRFHeader, "1"), http.StatusNotFound, apitype.CodeNotFound)
	// A cookie that looks like a session is no credential when the console is off.
	w := withCookie(s, &http.Cookie{Name: console.CookieName, Value: "x"}, "GET", "/v1/leases", "")
	wantProblem(t, w, http.StatusUnauthorized, apitype.CodeUnauthorized)
}

func TestConsoleSignIn(t *testing.T) {
	s, _ := newConsoleServer(t)
	for _, c := range []struct {
		name, token string
		hdr         []string
		status      int
		code        string
	}{
		{"wrong token", strings.Repeat("x", 40), []string{"Origin", selfOrigin, console.CSRFHeader, "1"}, 401, apitype.CodeUnauthorized},
		{"no CSRF header", handlerToken, []string{"Origin", selfOrigin}, 403, apitype.CodeForbidden},
		{"no Origin", handlerToken, []string{console.CSRFHeader, "1"}, 403, apitype.CodeForbidden},
		{"another site", handlerToken, []string{"Origin", "https://evil.example", console.CSRFHeader, "1"}, 403, apitype.CodeForbidden},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := signIn(s, c.token, c.hdr...)
			wantProblem(t, w, c.status, c.code)
			if len(w.Result().Cookies()) != 0 {
				t.Fatalf("a refused sign-in set a cookie: %q", w.Header().Values("Set-Cookie"))
			}
		})
	}
	// The refused sign-in with a wrong token counts as an authentication failure.
	if m := do(s, "GET", "/metrics", handlerToken, nil).Body.String(); !strings.Contains(m, "\nsidecar_auth_failures_total 1\n") {
		t.Errorf("after one wrong sign-in, /metrics has no sidecar_auth_failures_total 1")
	}
	c := sessionCookie(t, s)
	if !c.HttpOnly || !c.Secure || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.Domain != "" {
		t.Fatalf("cookie %+v: want HttpOnly, Secure, SameSite=Strict, Path=/, no Domain", c)
	}
	if c.MaxAge != int(console.SessionTTL.Seconds()) {
		t.Fatalf("cookie Max-Age %d, want %v", c.MaxAge, console.SessionTTL)
	}
	if strings.Contains(c.Value, handlerToken) || len(c.Value) < 40 {
		t.Fatalf("cookie value %q: want a random session id, not the token", c.Value)
	}
}

func TestConsoleCookieOnAPI(t *testing.T) {
	s, now := newConsoleServer(t)
	c := sessionCookie(t, s)

	w := withCookie(s, c, "GET", "/v1/leases", "")
	if w.Code != http.StatusOK {
		t.Fatalf("list with the cookie: %d %s", w.Code, w.Body)
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "sandbox") {
		t.Fatalf("API reply to the console has CSP %q: want a sandbox", csp)
	}
	acq := `{"session_id":"cone"}`
	for _, r := range []struct {
		name string
		hdr  []string
	}{
		{"no CSRF header", []string{"Origin", selfOrigin}},
		{"no Origin", []string{console.CSRFHeader, "1"}},
		{"another site", []string{"Origin", "https://evil.example", console.CSRFHeader, "1"}},
		{"another port", []string{"Origin", selfOrigin + ":8443", console.CSRFHeader, "1"}},
	} {
		t.Run(r.name, func(t *testing.T) {
			wantProblem(t, withCookie(s, c, "POST", "/v1/leases", acq, r.hdr...), http.StatusForbidden, apitype.CodeForbidden)
		})
	}
	if len(s.opts.Leases.List()) != 0 {
		t.Fatal("a refused request acquired a lease")
	}
	if w := withCookie(s, c, "POST", "/v1/leases", acq, "Origin", selfOrigin, console.CSRFHeader, "1"); w.Code != http.StatusCreated {
		t.Fatalf("acquire with the cookie, Origin and header: %d %s", w.Code, w.Body)
	}
	// A cross-site read is refused too, and so is a websocket without its Origin.
	wantProblem(t, withCookie(s, c, "GET", "/v1/leases", "", "Origin", "https://evil.example"), http.StatusForbidden, apitype.CodeForbidden)
	wantProblem(t, withCookie(s, c, "GET", "/v1/leases/x/exec?command=sh", "", "Upgrade", "websocket", "Connection", "Upgrade"), http.StatusForbidden, apitype.CodeForbidden)
	// A bearer credential is judged alone: a wrong one is not rescued by the cookie.
	wantProblem(t, withCookie(s, c, "GET", "/v1/leases", "", "Authorization", "Bearer "+strings.Repeat("y", 40)), http.StatusUnauthorized, apitype.CodeUnauthorized)
	// A forged cookie is nothing.
	wantProblem(t, withCookie(s, &http.Cookie{Name: console.CookieName, Value: c.Value + "x"}, "GET", "/v1/leases", ""), http.StatusUnauthorized, apitype.CodeUnauthorized)

	now.Add(int64(console.SessionTTL))
	wantProblem(t, withCookie(s, c, "GET", "/v1/leases", ""), http.StatusUnauthorized, apitype.CodeUnauthorized)
}

func TestConsoleSignOut(t *testing.T) {
	s, _ := newConsoleServer(t)
	c := sessionCookie(t, s)
	wantProblem(t, withCookie(s, c, "DELETE", "/ui/session", "", "Origin", "https://evil.example", console.CSRFHeader, "1"), http.StatusForbidden, apitype.CodeForbidden)
	if w := withCookie(s, c, "DELETE", "/ui/session", "", "Origin", selfOrigin, console.CSRFHeader, "1"); w.Code != http.StatusNoContent {
		t.Fatalf("sign-out: %d %s", w.Code, w.Body)
	}
	// The session ended in the daemon: the same cookie value no longer works.
	wantProblem(t, withCookie(s, c, "GET", "/v1/leases", ""), http.StatusUnauthorized, apitype.CodeUnauthorized)
}

func TestConsolePageHeaders(t *testing.T) {
	s, _ := newConsoleServer(t)
	w := do(s, "GET", "/ui/", "", nil)
	if w.Code != http.StatusOK {
		t.Fatalf("GET /ui/: %d %s", w.Code, w.Body)
	}
	csp := w.Header().Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self';", "connect-src 'self'", "frame-ancestors 'none'", "base-uri 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe") || strings.Contains(csp, "http") {
		t.Errorf("CSP %q allows inline code or another host", csp)
	}
	m := regexp.MustCompile(`'nonce-([^']+)'`).FindStringSubmatch(csp)
	if m == nil || !strings.Contains(w.Body.String(), m[1]) {
		t.Fatalf("the page does not carry the policy's style nonce (CSP %q)", csp)
	}
	if again := do(s, "GET", "/ui/", "", nil).Header().Get("Content-Security-Policy"); again == csp {
		t.Fatal("two page loads got the same nonce")
	}
	for h, v := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer"} {
		if got := w.Header().Get(h); got != v {
			t.Errorf("%s: %q, want %q", h, got, v)
		}
	}
	wantProblem(t, do(s, "GET", "/ui/nothing-here.js", "", nil), http.StatusNotFound, apitype.CodeNotFound)
	wantProblem(t, do(s, "POST", "/ui/", "", nil), http.StatusMethodNotAllowed, apitype.CodeMethodNotAllowed)
	if w := do(s, "GET", "/ui", "", nil); w.Code != http.StatusMovedPermanently || w.Header().Get("Location") != "/ui/" {
		t.Fatalf("GET /ui: %d %q", w.Code, w.Header().Get("Location"))
	}
}
