// Package console is the operator console the daemon serves at /ui/ when
// SIDECAR_CONSOLE=true: the built front end (dist/, embedded; its source is web/) and the
// browser session a person signs in to with the shared token. The console is a client of
// the v1 API: the daemon accepts the session cookie on the API routes in place of a
// bearer credential (Server.Authenticated, CheckRequest), and the console adds no API
// route of its own.
package console

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// The session's rules, all explicit (docs/operations.md, "The operator console").
const (
	// SessionTTL is how long a sign-in lasts; then the person signs in again. Sessions
	// live in the daemon's memory only: a restart ends them all.
	SessionTTL = 30 * time.Minute
	// MaxSessions is how many sessions may be open at once; a sign-in beyond ends the
	// oldest.
	MaxSessions = 64
	// CookieName has the __Host- prefix: the browser keeps it only when it is Secure,
	// has Path=/ and no Domain, so it goes back to this daemon's host alone.
	CookieName = "__Host-sidecar-console"
	// CSRFHeader must be on every state-changing request the cookie authenticates (and
	// on the sign-in): a cross-site page cannot set a custom header without a CORS
	// preflight, which the daemon never grants.
	CSRFHeader = "X-Sidecar-Console"
	// maxSignInBytes bounds the sign-in body ({"token": "…"}).
	maxSignInBytes = 4 << 10
)

// dist is the built front end (`make console`), committed so that a machine with Go
// alone serves it.
//
//go:embed all:dist
var dist embed.FS

// Console serves /ui/ and keeps the sessions.
type Console struct {
	checkToken func(string) bool
	audit      func(r *http.Request, ok bool)
	now        func() time.Time
	assets     fs.FS
	index      []byte // dist/index.html, with the nonce placeholder

	mu       sync.Mutex
	sessions map[[sha256.Size]byte]time.Time // SHA-256 of the cookie value → expiry
}

// New builds the console. checkToken says whether a string is the shared token (in
// constant time); audit hears of every sign-in with the token checked, accepted or not
// (nil: none); now is the daemon's clock (nil: time.Now).
func New(checkToken func(string) bool, audit func(r *http.Request, ok bool), now func() time.Time) *Console {
	if now == nil {
		now = time.Now
	}
	if audit == nil {
		audit = func(*http.Request, bool) {}
	}
	assets, _ := fs.Sub(dist, "dist") // cannot fail: "dist" is a valid name
	index, err := fs.ReadFile(assets, "index.html")
	if err != nil {
		index = []byte("<!doctype html><title>sidecar</title><p>This daemon was built without its console: run <code>make console</code>, then <code>make build</code>.")
	}
	return &Console{checkToken: checkToken, audit: audit, now: now, assets: assets, index: index,
		sessions: make(map[[sha256.Size]byte]time.Time)}
}

// Authenticated reports whether the request carries a live session cookie.
func (c *Console) Authenticated(r *http.Request) bool {
	ck, err := r.Cookie(CookieName)
	if err != nil || ck.Value == "" {
		return false
	}
	sum := sha256.Sum256([]byte(ck.Value))
	c.mu.Lock()
	defer c.mu.Unlock()
	exp, ok := c.sessions[sum]
	if !ok {
		return false
	}
	if !c.now().Before(exp) {
		delete(c.sessions, sum)
		return false
	}
	return true
}

// CheckRequest applies the cross-site rules to a request the session cookie
// authenticates: an Origin, when sent, must be the daemon's own; a state-changing
// request (any method but GET and HEAD) must send that Origin and CSRFHeader; a
// websocket upgrade must send that Origin. The error says which rule failed.
func CheckRequest(r *http.Request) error {
	origin := r.Header.Get("Origin")
	if origin != "" && !SameOrigin(r) {
		return errors.New("console session: cross-site request refused (Origin is not this daemon)")
	}
	upgrade := strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
	if (upgrade || !safeMethod(r.Method)) && origin == "" {
		return errors.New("console session: a state-changing request or websocket needs the Origin header")
	}
	if !safeMethod(r.Method) && r.Header.Get(CSRFHeader) != "1" {
		return errors.New("console session: a state-changing request needs the header " + CSRFHeader + ": 1")
	}
	return nil
}

// SameOrigin reports whether the request's Origin is the daemon itself as the browser
// reached it (https and the Host it asked for).
func SameOrigin(r *http.Request) bool {
	origin := r.Header.Get("Origin")
	return origin != "" && r.Host != "" && strings.EqualFold(origin, "https://"+r.Host)
}

func safeMethod(m string) bool { return m == http.MethodGet || m == http.MethodHead }

// ServeHTTP serves /ui/: the session (POST signs in, DELETE signs out) and the front
// end's files, each with the console's security headers.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	setSecurityHeaders(w.Header())
	if r.URL.Path == "/ui/session" {
		c.serveSession(w, r)
		return
	}
	if !safeMethod(r.Method) {
		w.Header().Set("Allow", "GET, HEAD")
		problem(w, http.StatusMethodNotAllowed, apitype.CodeMethodNotAllowed, r.Method+" is not allowed here; allowed: GET, HEAD")
		return
	}
	name := strings.TrimPrefix(r.URL.Path, "/ui/")
	if name == "" || name == "index.html" {
		c.serveIndex(w, r)
		return
	}
	b, err := fs.ReadFile(c.assets, name)
	if err != nil || strings.HasPrefix(name, ".") || strings.Contains(name, "/.") {
		problem(w, http.StatusNotFound, apitype.CodeNotFound, "no console file "+name)
		return
	}
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
}

// serveIndex serves the page with a fresh nonce: the page's style elements (xterm.js
// makes some at run time) carry it, so the policy needs no 'unsafe-inline'.
func (c *Console) serveIndex(w http.ResponseWriter, r *http.Request) {
	var raw [18]byte
	_, _ = rand.Read(raw[:])
	nonce := base64.StdEncoding.EncodeToString(raw[:])
	w.Header().Set("Content-Security-Policy", policy(nonce))
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	page := bytes.ReplaceAll(c.index, []byte("__CSP_NONCE__"), []byte(nonce))
	http.ServeContent(w, r, "index.html", time.Time{}, bytes.NewReader(page))
}

// policy is the console's Content-Security-Policy: scripts from the daemon only, no
// inline script, styles from the daemon or carrying the page's nonce, requests
// (fetch, websockets) to the daemon only, no frames, no plugins, no third party.
func policy(nonce string) string {
	style := "style-src 'self'"
	if nonce != "" {
		style += " 'nonce-" + nonce + "'"
	}
	return "default-src 'none'; script-src 'self'; " + style + "; img-src 'self' data: blob:; " +
		"font-src 'self'; connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
}

func setSecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", policy(""))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Cache-Control", "no-cache")
}

// APIResponseHeaders are set on every API reply to a cookie-authenticated request: a
// file of a lease opened in the browser is a download in a sandbox, never a page of the
// daemon's origin.
func APIResponseHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; sandbox; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}

// SignIn is the body of POST /ui/session.
type SignIn struct {
	Token string `json:"token"`
}

func (c *Console) serveSession(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	switch r.Method {
	case http.MethodPost:
		c.signIn(w, r)
	case http.MethodDelete:
		c.signOut(w, r)
	default:
		w.Header().Set("Allow", "POST, DELETE")
		problem(w, http.StatusMethodNotAllowed, apitype.CodeMethodNotAllowed, r.Method+" is not allowed here; allowed: POST, DELETE")
	}
}

// signIn trades the shared token for a session cookie. It obeys the rules of
// CheckRequest too, so no other site can sign a browser in to a session of its own.
func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	if err := CheckRequest(r); err != nil || r.Header.Get("Origin") == "" {
		problem(w, http.StatusForbidden, apitype.CodeForbidden, "sign-in needs the daemon's own Origin and the header "+CSRFHeader+": 1")
		return
	}
	var in SignIn
	dec := json.NewDecoder(io.LimitReader(r.Body, maxSignInBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		problem(w, http.StatusBadRequest, apitype.CodeInvalidRequest, `sign-in body: {"token": "<the shared token>"}`)
		return
	}
	ok := in.Token != "" && c.checkToken(in.Token)
	c.audit(r, ok)
	if !ok {
		problem(w, http.StatusUnauthorized, apitype.CodeUnauthorized, "not the shared token (SIDECAR_AUTH_TOKEN)")
		return
	}
	var raw [32]byte
	_, _ = rand.Read(raw[:])
	value := base64.RawURLEncoding.EncodeToString(raw[:])
	c.add(sha256.Sum256([]byte(value)))
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: value, Path: "/", MaxAge: int(SessionTTL.Seconds()),
		HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}

// add records a session, dropping expired ones and, at MaxSessions, the oldest.
func (c *Console) add(sum [sha256.Size]byte) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	var oldest [sha256.Size]byte
	var oldestExp time.Time
	for k, exp := range c.sessions {
		if !now.Before(exp) {
			delete(c.sessions, k)
			continue
		}
		if oldestExp.IsZero() || exp.Before(oldestExp) {
			oldest, oldestExp = k, exp
		}
	}
	if len(c.sessions) >= MaxSessions {
		delete(c.sessions, oldest)
	}
	c.sessions[sum] = now.Add(SessionTTL)
}

// signOut ends the session server-side, so a copy of the cookie is worthless too.
func (c *Console) signOut(w http.ResponseWriter, r *http.Request) {
	if err := CheckRequest(r); err != nil {
		problem(w, http.StatusForbidden, apitype.CodeForbidden, err.Error())
		return
	}
	if ck, err := r.Cookie(CookieName); err == nil {
		sum := sha256.Sum256([]byte(ck.Value))
		c.mu.Lock()
		delete(c.sessions, sum)
		c.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}

// problem writes an application/problem+json error, as the API does.
func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(apitype.Problem{Type: "https://sidecar.dev/problems/" + code,
		Title: http.StatusText(status), Status: status, Detail: detail, Code: code})
}
