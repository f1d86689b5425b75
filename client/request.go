package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// request is one call to the daemon. Bodies given as bytes can be sent again, so the
// call may be retried when idempotent; a streaming body never is.
type request struct {
	method     string
	path       string // escaped path below the base URL, e.g. /v1/leases/abc
	query      url.Values
	header     http.Header
	body       []byte    // re-readable body
	stream     io.Reader // streaming body, sent once
	length     int64     // of stream; -1 unknown
	json       any       // marshalled into body when set
	token      string    // credential; empty uses the client's
	lease      *Lease    // the handle whose credential the call uses; it keeps refreshed tokens
	idempotent bool
	bulk       bool // a large body either way: sent on the HTTP/1.1 client when there is one
}

// do sends r, retrying as its policy allows, and returns a 2xx response whose body the
// caller closes. Error replies become *APIError.
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	if r.json != nil {
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, fmt.Errorf("client: encode %s %s: %w", r.method, r.path, err)
		}
		r.body = b
		if r.header == nil {
			r.header = http.Header{}
		}
		r.header.Set("Content-Type", "application/json")
	}
	u := c.base.String() + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	token := r.token
	if r.lease != nil {
		token = r.lease.cred()
	}
	if token == "" {
		token = c.token
	}
	for attempt := 1; ; attempt++ {
		var body io.Reader
		switch {
		case r.body != nil:
			body = bytes.NewReader(r.body)
		case r.stream != nil:
			body = r.stream
		}
		req, err := http.NewRequestWithContext(ctx, r.method, u, body)
		if err != nil {
			return nil, fmt.Errorf("client: %s %s: %w", r.method, r.path, err)
		}
		if r.stream != nil {
			req.ContentLength = r.length
			if r.length == 0 {
				req.Body = http.NoBody
			}
		}
		for k, v := range r.header {
			req.Header[k] = v
		}
		if token != "" {
			req.Header.Set(apitype.HeaderAuthorization, apitype.BearerScheme+" "+token)
		}
		hc := c.hc
		if r.bulk && c.bulk != nil {
			hc = c.bulk
		}
		resp, err := hc.Do(req)
		if err == nil && r.lease != nil {
			r.lease.tokenRefreshed(resp.Header.Get(apitype.HeaderLeaseToken))
		}
		retry := r.idempotent && r.stream == nil && attempt < c.retry.attempts && ctx.Err() == nil
		if err != nil {
			if retry && isConnError(err) {
				c.log.DebugContext(ctx, "retrying after connection error", "method", r.method, "path", r.path, "attempt", attempt, "err", err)
				if werr := c.retry.wait(ctx, attempt); werr != nil {
					return nil, withHint(err)
				}
				continue
			}
			return nil, withHint(err)
		}
		if resp.StatusCode < 300 {
			return resp, nil
		}
		apiErr := errorFromResponse(resp)
		resp.Body.Close()
		if retry && resp.StatusCode == http.StatusServiceUnavailable {
			c.log.DebugContext(ctx, "retrying after 503", "method", r.method, "path", r.path, "attempt", attempt)
			if werr := c.retry.wait(ctx, attempt); werr != nil {
				return nil, apiErr
			}
			continue
		}
		return nil, apiErr
	}
}

// doJSON sends r and decodes a 2xx body into out (unless out is nil).
func (c *Client) doJSON(ctx context.Context, r request, out any) error {
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProblemBytes))
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("client: decode %s %s: %w", r.method, r.path, err)
	}
	return nil
}

// leasePath is /v1/leases/{id} followed by the given (already escaped) parts.
func leasePath(id string, parts ...string) string {
	p := apitype.RouteLeases + "/" + url.PathEscape(id)
	for _, s := range parts {
		p += "/" + s
	}
	return p
}

// escapePath checks a workdir path (relative, or absolute under apitype.Workspace) and
// escapes it segment by segment; an absolute one stays absolute. The daemon refuses
// escaping paths too; checking here saves the round trip and keeps ServeMux from
// redirecting an unclean path.
func escapePath(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("%w: path contains NUL", ErrInvalidRequest)
	}
	abs := ""
	if path.IsAbs(p) {
		rest, ok := strings.CutPrefix(p, apitype.Workspace)
		if !ok || (rest != "" && rest[0] != '/') {
			return "", fmt.Errorf("%w: %q is absolute and not under %s", ErrPathOutsideWorkdir, p, apitype.Workspace)
		}
		abs, p = apitype.Workspace, "."+rest
	}
	clean := path.Clean(p)
	if clean == ".." || strings.HasPrefix(clean, "../") {
		return "", fmt.Errorf("%w: %q", ErrPathOutsideWorkdir, p)
	}
	if clean == "." {
		return abs, nil
	}
	segs := strings.Split(clean, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	if abs != "" {
		return abs + "/" + strings.Join(segs, "/"), nil
	}
	return strings.Join(segs, "/"), nil
}
