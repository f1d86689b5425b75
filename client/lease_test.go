package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// fakeLeases plays acquire/renew/release with a TTL short enough to watch renewals.
type fakeLeases struct {
	t       *testing.T
	ttl     time.Duration
	mu      sync.Mutex
	renews  int
	expired bool // renew answers 410 once set
	release int
}

func (f *fakeLeases) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !requireAuth(f.t, r, testToken) {
		writeProblem(w, 401, apitype.CodeUnauthorized, "")
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	lease := apitype.Lease{ID: "L1", SessionID: "s1", State: apitype.LeaseActive, CreatedAt: now, ExpiresAt: now.Add(f.ttl)}
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/leases":
		var req apitype.AcquireRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.SessionID != "s1" {
			writeProblem(w, 400, apitype.CodeInvalidRequest, "")
			return
		}
		lease.Token = "token-0"
		writeJSON(w, http.StatusCreated, lease)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/leases/L1/renew":
		if f.expired {
			writeProblem(w, 410, apitype.CodeLeaseExpired, "")
			return
		}
		f.renews++
		lease.Token = fmt.Sprintf("token-%d", f.renews)
		writeJSON(w, http.StatusOK, lease)
	case r.Method == http.MethodDelete && r.URL.Path == "/v1/leases/L1":
		f.release++
		w.WriteHeader(http.StatusNoContent)
	default:
		writeProblem(w, 404, apitype.CodeNotFound, r.Method+" "+r.URL.Path)
	}
}

func (f *fakeLeases) counts() (renews, releases int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renews, f.release
}

func TestLeaseRenewsItselfUntilReleased(t *testing.T) {
	f := &fakeLeases{t: t, ttl: 300 * time.Millisecond}
	c, _ := newTestClient(t, f)
	l, err := c.Acquire(context.Background(), apitype.AcquireRequest{SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if l.ID() != "L1" || l.Token() != "token-0" {
		t.Fatalf("lease %s token %s", l.ID(), l.Token())
	}
	eventually(t, "two renewals", func() bool { n, _ := f.counts(); return n >= 2 })
	if l.Token() == "token-0" || l.Err() != nil {
		t.Fatalf("after renewals: token %q err %v", l.Token(), l.Err())
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, releases := f.counts(); releases != 1 {
		t.Fatalf("%d releases", releases)
	}
	// Release returns only once the renewer has stopped: no renewal can follow it.
	select {
	case <-l.stopped:
	default:
		t.Fatal("renewer still running after Release")
	}
}

// A request-scoped context given to Acquire must not end the renewal: it belongs to the
// handle and ends with StopRenewing or Release.
func TestLeaseRenewalOutlivesAcquireContext(t *testing.T) {
	f := &fakeLeases{t: t, ttl: 300 * time.Millisecond}
	c, _ := newTestClient(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	l, err := c.Acquire(ctx, apitype.AcquireRequest{SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	eventually(t, "two renewals after the context ended", func() bool { n, _ := f.counts(); return n >= 2 })
	if l.Err() != nil {
		t.Fatalf("renewal error: %v", l.Err())
	}
	l.StopRenewing()
	select {
	case <-l.stopped:
	default:
		t.Fatal("renewer still running after StopRenewing")
	}
	n, releases := f.counts()
	if releases != 0 {
		t.Fatalf("StopRenewing released the lease")
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after, _ := f.counts(); after != n {
		t.Fatalf("renewed %d times after StopRenewing", after-n)
	}
}

func TestLeaseRenewalSurfacesExpiry(t *testing.T) {
	f := &fakeLeases{t: t, ttl: 150 * time.Millisecond, expired: true}
	c, _ := newTestClient(t, f)
	l, err := c.Acquire(context.Background(), apitype.AcquireRequest{SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "renewal error", func() bool { return l.Err() != nil })
	if !errors.Is(l.Err(), ErrLeaseExpired) || !IsLeaseGone(l.Err()) {
		t.Fatalf("Err = %v", l.Err())
	}
	select {
	case <-l.stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("renewer kept going after lease_expired")
	}
}

func TestOpenLeaseUsesLeaseToken(t *testing.T) {
	c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !requireAuth(t, r, "the-lease-token") {
			writeProblem(w, 401, apitype.CodeUnauthorized, "")
			return
		}
		writeJSON(w, 200, apitype.ExecResult{ExitCode: 3, Stdout: "out"})
	}))
	res, err := c.OpenLease("L1", "the-lease-token").Exec(context.Background(), apitype.ExecRequest{Argv: []string{"x"}})
	if err != nil || res.ExitCode != 3 || res.Stdout != "out" {
		t.Fatalf("res %+v err %v", res, err)
	}
}

func TestEscapePath(t *testing.T) {
	tests := []struct {
		in, want string
		err      error
	}{
		{"a/b c/d.txt", "a/b%20c/d.txt", nil},
		{"./x/../y", "y", nil},
		{".", "", nil},
		{"", "", nil},
		{"ünï/%?#", "%C3%BCn%C3%AF/%25%3F%23", nil},
		{"/etc/passwd", "", ErrPathOutsideWorkdir},
		{"/workspace", "/workspace", nil},
		{"/workspace/", "/workspace", nil},
		{"/workspace/a b/./c", "/workspace/a%20b/c", nil},
		{"/workspace/..", "", ErrPathOutsideWorkdir},
		{"/workspace/../etc", "", ErrPathOutsideWorkdir},
		{"/workspaces/x", "", ErrPathOutsideWorkdir},
		{"../x", "", ErrPathOutsideWorkdir},
		{"a/../../x", "", ErrPathOutsideWorkdir},
		{"a\x00b", "", ErrInvalidRequest},
	}
	for _, tt := range tests {
		got, err := escapePath(tt.in)
		if !errors.Is(err, tt.err) || got != tt.want {
			t.Errorf("escapePath(%q) = %q, %v; want %q, %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}
