package client

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func TestErrorMapping(t *testing.T) {
	tests := []struct {
		status int
		code   string
		want   error
	}{
		{401, apitype.CodeUnauthorized, ErrUnauthorized},
		{403, apitype.CodeForbidden, ErrForbidden},
		{400, apitype.CodeInvalidRequest, ErrInvalidRequest},
		{404, apitype.CodeNotFound, ErrNotFound},
		{404, apitype.CodeLeaseNotFound, ErrLeaseNotFound},
		{410, apitype.CodeLeaseExpired, ErrLeaseExpired},
		{429, apitype.CodeLeaseLimit, ErrLeaseLimit},
		{404, apitype.CodeProcessNotFound, ErrProcessNotFound},
		{400, apitype.CodePathOutsideWorkdir, ErrPathOutsideWorkdir},
		{400, apitype.CodeNotADirectory, ErrNotADirectory},
		{400, apitype.CodeIsADirectory, ErrIsADirectory},
		{409, apitype.CodeExists, ErrExists},
		{507, apitype.CodeQuotaExceeded, ErrQuotaExceeded},
		{400, apitype.CodeDigestMismatch, ErrDigestMismatch},
		{413, apitype.CodePayloadTooLarge, ErrPayloadTooLarge},
		{404, apitype.CodeCapabilityDisabled, ErrCapability},
		{422, apitype.CodeScriptError, ErrScript},
		{422, apitype.CodeScriptTimeout, ErrScriptTimeout},
		{500, apitype.CodeInternal, ErrInternal},
		{400, apitype.CodeInvalidNetworkPolicy, ErrInvalidNetworkPolicy},
		{502, apitype.CodePortUnreachable, ErrPortUnreachable},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				writeProblem(w, tt.status, tt.code, "detail of "+tt.code)
			}))
			_, err := c.Get(context.Background(), "L1")
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			var apiErr *APIError
			if !errors.As(err, &apiErr) || apiErr.Status != tt.status || apiErr.Code != tt.code || apiErr.Detail != "detail of "+tt.code {
				t.Fatalf("APIError = %+v", apiErr)
			}
			for _, other := range []error{ErrUnauthorized, ErrLeaseExpired, ErrNotFound} {
				if other != tt.want && errors.Is(err, other) {
					t.Errorf("err also matches %v", other)
				}
			}
		})
	}
}

func TestErrorWithoutProblemBody(t *testing.T) {
	tests := []struct {
		status int
		want   error
	}{
		{502, ErrUnavailable},
		{401, ErrUnauthorized},
		{404, ErrNotFound},
		{500, ErrInternal},
	}
	for _, tt := range tests {
		c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(tt.status)
			_, _ = w.Write([]byte("<html>proxy says no</html>"))
		}))
		_, err := c.List(context.Background())
		if !errors.Is(err, tt.want) {
			t.Errorf("%d: err = %v, want %v", tt.status, err, tt.want)
		}
	}
}

func TestScriptErrorPosition(t *testing.T) {
	c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", apitype.ProblemContentType)
		w.WriteHeader(422)
		_, _ = w.Write([]byte(`{"type":"x","title":"Script error","status":422,"code":"script_error","detail":"ReferenceError: y","line":3,"column":7}`))
	}))
	_, err := c.RunScript(context.Background(), apitype.ScriptRequest{Source: "function transform(i){ return y }"})
	var apiErr *APIError
	if !errors.Is(err, ErrScript) || !errors.As(err, &apiErr) || apiErr.Line != 3 || apiErr.Column != 7 {
		t.Fatalf("err = %v (%+v)", err, apiErr)
	}
}

// A HEAD error has no body; Stat asks again with a GET to learn the exact code.
func TestStatExplainsHeadError(t *testing.T) {
	c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, 404, apitype.CodeLeaseNotFound, "")
	}))
	_, err := c.OpenLease("L1", "lease-token").Stat(context.Background(), "a.txt")
	if !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("err = %v, want ErrLeaseNotFound", err)
	}
}

func TestHelpers(t *testing.T) {
	gone := &APIError{Status: 410, Code: apitype.CodeLeaseExpired}
	if !IsLeaseGone(gone) || IsNotFound(gone) || IsUnauthorized(gone) {
		t.Error("lease_expired helpers")
	}
	nf := &APIError{Status: 404, Code: apitype.CodeProcessNotFound}
	if !IsNotFound(nf) || IsLeaseGone(nf) {
		t.Error("process_not_found helpers")
	}
	if !IsUnauthorized(&APIError{Status: 403, Code: apitype.CodeForbidden}) {
		t.Error("forbidden helper")
	}
}
