package sidecar

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/sidecar/console"
)

// access says which credentials a route takes.
type access int

const (
	public     access = iota // no credential (healthz)
	sharedOnly               // the shared token only
	anyCred                  // the shared token or any active lease's token
	leaseScope               // the shared token, or the token of the lease named by {id}
)

// principal is who a request acts as.
type principal struct {
	shared  bool
	leaseID string // set for a lease token
	// stale: the lease outlives the lease token (its owner renewed it), so the reply
	// carries a fresh token in X-Lease-Token.
	stale bool
}

// authenticator checks credentials. Shared tokens are compared as SHA-256 digests in
// constant time, so neither their length nor a prefix leaks through timing.
type authenticator struct {
	shared [][sha256.Size]byte // current first, then the previous one during a rotation
	tokens *lease.Tokens
	leases Leases
}

func newAuthenticator(secrets []string, tokens *lease.Tokens, leases Leases) *authenticator {
	a := &authenticator{tokens: tokens, leases: leases}
	for _, s := range secrets {
		if s != "" {
			a.shared = append(a.shared, sha256.Sum256([]byte(s)))
		}
	}
	return a
}

// queryCredentialNames are query parameters that would carry a credential; the contract
// forbids credentials in a query string (they end up in logs and browser history).
var queryCredentialNames = []string{"access_token", "token", "auth", "authorization", "bearer", "api_key"}

func unauthorized(detail string) *Error {
	return errorf(http.StatusUnauthorized, apitype.CodeUnauthorized, "%s", detail)
}

func forbidden(detail string) *Error {
	return errorf(http.StatusForbidden, apitype.CodeForbidden, "%s", detail)
}

// authenticate returns the request's principal or a 401/403 error.
func (a *authenticator) authenticate(r *http.Request, need access) (principal, error) {
	if need == public {
		return principal{}, nil
	}
	q := r.URL.Query()
	for _, name := range queryCredentialNames {
		if q.Has(name) {
			return principal{}, unauthorized("credentials are accepted only in the Authorization header or the websocket bearer subprotocol, never in a query string")
		}
	}
	cred, ok := credential(r)
	if !ok {
		return principal{}, unauthorized("missing bearer credential")
	}
	if a.isShared(cred) {
		return principal{shared: true}, nil
	}
	if strings.Count(cred, ".") != 2 {
		return principal{}, unauthorized("invalid credential")
	}
	id, expires, err := a.tokens.VerifyExpiry(cred)
	if err != nil {
		return principal{}, unauthorized("invalid or expired lease token")
	}
	// A lease token is honoured only while its lease is active.
	l, err := a.leases.Get(id)
	if err != nil {
		return principal{}, unauthorized("the token's lease is no longer active")
	}
	// Token expiries are whole seconds (JWT NumericDate).
	p := principal{leaseID: id, stale: l.ExpiresAt.Truncate(time.Second).After(expires)}
	switch need {
	case sharedOnly:
		return p, forbidden("this route needs the shared token")
	case leaseScope:
		if r.PathValue("id") != id {
			return p, forbidden("the lease token is not valid for this lease")
		}
	}
	return p, nil
}

func (a *authenticator) isShared(cred string) bool {
	sum := sha256.Sum256([]byte(cred))
	match := 0
	for i := range a.shared {
		match |= subtle.ConstantTimeCompare(sum[:], a.shared[i][:])
	}
	return match == 1
}

// credential finds the bearer credential in the Authorization header or, for browsers
// that cannot set headers on a websocket, in the Kubernetes bearer subprotocol.
func credential(r *http.Request) (string, bool) {
	if h := r.Header.Get(apitype.HeaderAuthorization); h != "" {
		scheme, token, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, apitype.BearerScheme) {
			return "", false
		}
		token = strings.TrimSpace(token)
		return token, token != ""
	}
	for _, p := range websocketProtocols(r) {
		if enc, ok := strings.CutPrefix(p, apitype.BearerSubprotocolPrefix); ok {
			b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(enc, "="))
			if err != nil || len(b) == 0 {
				return "", false
			}
			return string(b), true
		}
	}
	return "", false
}

// websocketProtocols lists the subprotocols a websocket upgrade request offers.
func websocketProtocols(r *http.Request) []string {
	var out []string
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// originAllowed applies the browser policy: a request with an Origin header is refused
// unless that origin is listed.
func originAllowed(r *http.Request, allowed []string) bool {
	origin := r.Header.Get(apitype.HeaderOrigin)
	if origin == "" {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(strings.TrimRight(a, "/"), origin) {
			return true
		}
	}
	return false
}

// originAllowed is the browser policy of this server: a listed origin, or, with the
// console on, the daemon's own origin (the console's pages).
func (s *Server) originAllowed(r *http.Request) bool {
	return originAllowed(r, s.opts.AllowedOrigins) || (s.console != nil && console.SameOrigin(r))
}

// authenticate finds the request's principal: a bearer credential when the request
// carries one, else, with the console on, a live console session cookie, which acts as
// the shared token under the console's cross-site rules.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, need access) (principal, error) {
	c := s.console
	if need == public || c == nil || hasCredential(r) || !c.Authenticated(r) {
		return s.auth.authenticate(r, need)
	}
	if err := console.CheckRequest(r); err != nil {
		return principal{}, forbidden(err.Error())
	}
	console.APIResponseHeaders(w.Header())
	return principal{shared: true}, nil
}

// auditSignIn logs a console sign-in, and counts a refused one with the other
// authentication failures (sidecar_auth_failures_total).
func (s *Server) auditSignIn(r *http.Request, ok bool) {
	if !ok {
		s.metrics.authFailures.Inc()
		s.log.WarnContext(r.Context(), "console sign-in refused", "audit", true, "remote", r.RemoteAddr, "reason", "not the shared token")
		return
	}
	s.log.InfoContext(r.Context(), "console sign-in", "audit", true, "remote", r.RemoteAddr)
}

// hasCredential reports whether the request offers a bearer credential, good or bad;
// such a request is judged by it alone, whatever cookie comes with it.
func hasCredential(r *http.Request) bool {
	if r.Header.Get(apitype.HeaderAuthorization) != "" {
		return true
	}
	for _, p := range websocketProtocols(r) {
		if strings.HasPrefix(p, apitype.BearerSubprotocolPrefix) {
			return true
		}
	}
	return false
}
