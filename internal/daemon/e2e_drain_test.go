package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
)

// A draining daemon refuses new leases with 503 draining, returns a session's existing
// lease, keeps serving it, reports the drain in /v1/info and /readyz (not /healthz), and
// takes leases again after the undo.
func TestDrain(t *testing.T) {
	d := startDaemon(t, func(c *daemon.Config) { c.CapacityMemoryBytes = 1 << 30 })
	ctx := context.Background()
	l := d.acquire("drain-kept")

	info := must(d.client.Info(ctx))(t)
	want := apitype.Capacity{ActiveLeases: 1, FreeLeases: 7, MemoryBytes: 1 << 30, MemoryCommittedBytes: 256 << 20, MemoryHeadroomBytes: 768 << 20}
	if info.Draining || info.Capacity != want {
		t.Fatalf("info before drain: draining %v capacity %+v, want %+v", info.Draining, info.Capacity, want)
	}
	if status, _, _ := d.raw("GET", "/readyz", "", nil, nil); status != http.StatusOK {
		t.Fatalf("readyz before drain: %d", status)
	}

	// Lease tokens may not drain.
	status, hdr, body := d.raw("POST", "/v1/drain", l.Token(), nil, nil)
	wantProblem(t, status, hdr, body, http.StatusForbidden, apitype.CodeForbidden)

	st := must(d.client.Drain(ctx, true))(t)
	if !st.Draining || st.ActiveLeases != 1 {
		t.Fatalf("drain: %+v", st)
	}
	if st := must(d.client.Drain(ctx, true))(t); !st.Draining { // idempotent
		t.Fatalf("second drain: %+v", st)
	}

	_, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "drain-new"})
	if !errors.Is(err, client.ErrDraining) {
		t.Fatalf("acquire while draining: %v, want ErrDraining", err)
	}
	status, hdr, body = d.raw("POST", "/v1/leases", testToken, jsonBody(apitype.AcquireRequest{SessionID: "drain-new"}), nil)
	wantProblem(t, status, hdr, body, http.StatusServiceUnavailable, apitype.CodeDraining)
	if list := must(d.client.List(ctx))(t); len(list) != 1 {
		t.Fatalf("a lease was created while draining: %+v", list)
	}

	// The session's own lease is still returned, and still works.
	status, _, body = d.raw("POST", "/v1/leases", testToken, jsonBody(apitype.AcquireRequest{SessionID: "drain-kept"}), nil)
	if status != http.StatusOK || !strings.Contains(string(body), l.ID()) || !strings.Contains(string(body), `"token"`) {
		t.Fatalf("re-acquire while draining: %d %s", status, body)
	}
	res, err := l.Exec(ctx, apitype.ExecRequest{Argv: []string{"echo", "still here"}})
	if err != nil || strings.TrimSpace(res.Stdout) != "still here" {
		t.Fatalf("exec while draining: %+v %v", res, err)
	}
	if _, err := d.client.Renew(ctx, l.ID(), 0); err != nil {
		t.Fatalf("renew while draining: %v", err)
	}

	info = must(d.client.Info(ctx))(t)
	if !info.Draining {
		t.Fatal("info while draining: draining false")
	}
	status, hdr, body = d.raw("GET", "/readyz", "", nil, nil)
	wantProblem(t, status, hdr, body, http.StatusServiceUnavailable, apitype.CodeDraining)
	if status, _, _ := d.raw("GET", "/healthz", "", nil, nil); status != http.StatusOK {
		t.Fatalf("healthz while draining: %d, want 200 (liveness)", status)
	}

	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st := must(d.client.Drain(ctx, true))(t); st.ActiveLeases != 0 {
		t.Fatalf("after release: %+v", st)
	}

	if st := must(d.client.Drain(ctx, false))(t); st.Draining {
		t.Fatalf("undrain: %+v", st)
	}
	d.acquire("drain-new")
	if status, _, _ := d.raw("GET", "/readyz", "", nil, nil); status != http.StatusOK {
		t.Fatalf("readyz after undo: %d", status)
	}
}
