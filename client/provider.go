package client

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// Provider is what an app or a worker holds: one value, built from the environment, that
// creates or reconnects the sandbox of a session, runs commands and moves files in it,
// and releases it. With sandboxes disabled (SANDBOX_PROVIDER unset or not "remote") every
// sandbox operation fails with ErrCapability, while Cleanup and Release of leases made
// earlier keep working as long as a URL and a token are configured. SCRIPT_ENABLED=false
// makes RunScript fail the same way without a round trip.
//
// A Provider is safe for concurrent use.
type Provider struct {
	c *Client // nil without a usable URL and token
	// disabled is why sandbox operations fail (wraps ErrCapability); nil when enabled.
	disabled error
	// noScripts is why RunScript fails (wraps ErrCapability); nil when scripts are on.
	noScripts error
	// remoteErr is why there is no client (a configuration error); nil when c is set.
	remoteErr error

	mu        sync.Mutex
	sandboxes map[string]*Lease // by session id; each renews itself until released
}

// ProviderFromEnv builds the Provider from SANDBOX_PROVIDER, SANDBOX_REMOTE_* and
// SCRIPT_ENABLED. With SANDBOX_PROVIDER=remote a bad remote configuration is an error
// naming every variable at fault; with sandboxes disabled it is not (the Provider then
// refuses sandbox operations, and Cleanup and Release report the configuration error).
func ProviderFromEnv() (*Provider, error) { return providerFromLookup(os.LookupEnv) }

func providerFromLookup(lookup func(string) (string, bool)) (*Provider, error) {
	get := func(k string) string { v, _ := lookup(k); return strings.TrimSpace(v) }
	p := &Provider{sandboxes: map[string]*Lease{}}
	if v := get(EnvProvider); v != ProviderRemote {
		p.disabled = fmt.Errorf("%w: agent sandboxes are disabled: %s is %q; set %s=remote to use sidecar",
			ErrCapability, EnvProvider, v, EnvProvider)
	}
	if v := get(EnvScriptEnabled); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("client configuration: %s=%q is not a boolean", EnvScriptEnabled, v)
		}
		if !on {
			p.noScripts = fmt.Errorf("%w: scripts are disabled: %s=%s", ErrCapability, EnvScriptEnabled, v)
		}
	}
	cfg, err := remoteConfig(lookup, false)
	if err == nil {
		p.c, err = New(cfg)
	}
	if err != nil {
		if p.disabled == nil {
			return nil, err
		}
		p.remoteErr = err
	}
	return p, nil
}

// NewProvider is a Provider with sandboxes enabled over c (scripts on), for programs
// that build their Client themselves.
func NewProvider(c *Client) *Provider {
	return &Provider{c: c, sandboxes: map[string]*Lease{}}
}

// Enabled reports whether sandbox operations are available.
func (p *Provider) Enabled() bool { return p.disabled == nil }

// Client is the underlying client, nil when no URL and token are configured.
func (p *Provider) Client() *Client { return p.c }

// Sandbox creates the sandbox of req.SessionID or reconnects to its active one (the daemon
// keeps one lease per session), and keeps it renewed until Release. A second call for the
// same session returns the same handle while its lease lives.
func (p *Provider) Sandbox(ctx context.Context, req apitype.AcquireRequest) (*Lease, error) {
	if p.disabled != nil {
		return nil, p.disabled
	}
	if req.SessionID == "" {
		return nil, fmt.Errorf("%w: a session id is required", ErrInvalidRequest)
	}
	p.mu.Lock()
	l := p.sandboxes[req.SessionID]
	p.mu.Unlock()
	if l != nil && !IsLeaseGone(l.Err()) {
		return l, nil
	}
	fresh, err := p.c.Acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur := p.sandboxes[req.SessionID]; cur != nil && cur != l && cur.ID() == fresh.ID() {
		// Another call reconnected first: keep one renewer per lease.
		fresh.StopRenewing()
		return cur, nil
	}
	if l != nil {
		l.StopRenewing()
	}
	p.sandboxes[req.SessionID] = fresh
	return fresh, nil
}

// sandbox is the session's handle, reconnecting with default settings when needed.
func (p *Provider) sandbox(ctx context.Context, sessionID string) (*Lease, error) {
	return p.Sandbox(ctx, apitype.AcquireRequest{SessionID: sessionID})
}

// Exec runs a command to completion in the session's sandbox.
func (p *Provider) Exec(ctx context.Context, sessionID string, req apitype.ExecRequest) (apitype.ExecResult, error) {
	l, err := p.sandbox(ctx, sessionID)
	if err != nil {
		return apitype.ExecResult{}, err
	}
	return l.Exec(ctx, req)
}

// WriteFile writes data to a workdir-relative path of the session's sandbox.
func (p *Provider) WriteFile(ctx context.Context, sessionID, path string, data []byte, mode fs.FileMode) error {
	l, err := p.sandbox(ctx, sessionID)
	if err != nil {
		return err
	}
	return l.WriteFile(ctx, path, data, mode)
}

// ReadFile reads a workdir-relative file of the session's sandbox.
func (p *Provider) ReadFile(ctx context.Context, sessionID, path string) ([]byte, error) {
	l, err := p.sandbox(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	return l.ReadFile(ctx, path)
}

// UploadDir copies a local directory tree into the session's sandbox.
func (p *Provider) UploadDir(ctx context.Context, sessionID, localDir, remoteDir string, opts ...DirOption) error {
	l, err := p.sandbox(ctx, sessionID)
	if err != nil {
		return err
	}
	return l.UploadDir(ctx, localDir, remoteDir, opts...)
}

// DownloadDir copies a directory tree of the session's sandbox to a local directory.
func (p *Provider) DownloadDir(ctx context.Context, sessionID, remoteDir, localDir string, opts ...DirOption) error {
	l, err := p.sandbox(ctx, sessionID)
	if err != nil {
		return err
	}
	return l.DownloadDir(ctx, remoteDir, localDir, opts...)
}

// RunScript runs a QuickJS transform on the daemon. SCRIPT_ENABLED=false fails it with
// ErrCapability before any request is sent.
func (p *Provider) RunScript(ctx context.Context, req apitype.ScriptRequest) (apitype.ScriptResult, error) {
	if p.noScripts != nil {
		return apitype.ScriptResult{}, p.noScripts
	}
	if p.disabled != nil {
		return apitype.ScriptResult{}, p.disabled
	}
	return p.c.RunScript(ctx, req)
}

// Release releases the session's sandbox: its processes are killed and its workdir is
// removed. It works with sandboxes disabled too (cleaning up what was made before), as
// long as a URL and a token are configured. A session without a lease is
// ErrLeaseNotFound.
func (p *Provider) Release(ctx context.Context, sessionID string) error {
	if p.c == nil {
		return p.remoteErr
	}
	p.mu.Lock()
	l := p.sandboxes[sessionID]
	delete(p.sandboxes, sessionID)
	p.mu.Unlock()
	if l != nil {
		err := l.Release(ctx)
		if !errors.Is(err, ErrLeaseNotFound) {
			return err
		}
		// Released or expired behind this handle's back: look the session up again, it
		// may hold a newer lease.
	}
	leases, listErr := p.c.List(ctx)
	if listErr != nil && len(leases) == 0 {
		return listErr
	}
	// On a fleet, some sidecars may not have answered: the session is looked for among
	// the others', and the error is kept for when it is not found there.
	found := false
	for _, info := range leases {
		if info.SessionID != sessionID {
			continue
		}
		found = true
		if err := p.c.Release(ctx, info.ID); err != nil && !errors.Is(err, ErrLeaseNotFound) {
			return err
		}
	}
	if !found {
		if listErr != nil {
			return listErr
		}
		return fmt.Errorf("%w: no lease for session %q", ErrLeaseNotFound, sessionID)
	}
	return nil
}

// Cleanup reaps expired leases and orphans on the daemon. It works with sandboxes
// disabled, as long as a URL and a token are configured.
func (p *Provider) Cleanup(ctx context.Context) (apitype.CleanupResult, error) {
	if p.c == nil {
		return apitype.CleanupResult{}, p.remoteErr
	}
	return p.c.Cleanup(ctx)
}

// Leases lists the daemon's leases (shared token), with sandboxes disabled too.
func (p *Provider) Leases(ctx context.Context) ([]apitype.Lease, error) {
	if p.c == nil {
		return nil, p.remoteErr
	}
	return p.c.List(ctx)
}

// Close stops renewing every sandbox this Provider holds without releasing them: they
// live on until their TTL (a worker exiting while its session continues elsewhere).
func (p *Provider) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, l := range p.sandboxes {
		l.StopRenewing()
		delete(p.sandboxes, id)
	}
}
