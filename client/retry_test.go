package client

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// The first requests lose their connection before any reply; what is retried depends on
// the call being idempotent.
func TestRetryOnDroppedConnection(t *testing.T) {
	tests := []struct {
		name      string
		drops     int32
		call      func(*Client) error
		wantCalls int32
		wantErr   bool
	}{
		{"get retried", 2, func(c *Client) error { _, err := c.Get(context.Background(), "L1"); return err }, 3, false},
		{"get gives up", 5, func(c *Client) error { _, err := c.Get(context.Background(), "L1"); return err }, 3, true},
		{"acquire retried", 1, func(c *Client) error {
			_, err := c.acquire(context.Background(), apitype.AcquireRequest{SessionID: "s"})
			return err
		}, 2, false},
		{"exec not retried", 1, func(c *Client) error {
			_, err := c.OpenLease("L1", "tok").Exec(context.Background(), apitype.ExecRequest{Argv: []string{"true"}})
			return err
		}, 1, true},
		{"start without id not retried", 1, func(c *Client) error {
			_, err := c.OpenLease("L1", "tok").Start(context.Background(), apitype.StartRequest{Argv: []string{"true"}})
			return err
		}, 1, true},
		{"write file retried", 2, func(c *Client) error {
			return c.OpenLease("L1", "tok").WriteFile(context.Background(), "a", []byte("hi"), 0o600)
		}, 3, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) <= tt.drops {
					dropConnection(t, w)
					return
				}
				writeJSON(w, http.StatusOK, apitype.Lease{ID: "L1"})
			}))
			err := tt.call(c)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got := calls.Load(); got != tt.wantCalls {
				t.Fatalf("server saw %d requests, want %d", got, tt.wantCalls)
			}
		})
	}
}

func TestRetryOnlyOn503(t *testing.T) {
	tests := []struct {
		status    int
		wantCalls int32
	}{
		{http.StatusServiceUnavailable, 3},
		{http.StatusInternalServerError, 1},
		{http.StatusTooManyRequests, 1},
	}
	for _, tt := range tests {
		var calls atomic.Int32
		c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			writeProblem(w, tt.status, codeByStatus[tt.status], "")
		}))
		if _, err := c.List(context.Background()); err == nil {
			t.Fatalf("%d: no error", tt.status)
		}
		if got := calls.Load(); got != tt.wantCalls {
			t.Errorf("%d: %d requests, want %d", tt.status, got, tt.wantCalls)
		}
	}
}

func TestRetryHonoursContext(t *testing.T) {
	var calls atomic.Int32
	c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		dropConnection(t, w)
	}))
	c.retry = retryPolicy{attempts: 100, base: time.Hour, max: time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		eventually(t, "first request", func() bool { return calls.Load() > 0 })
		cancel()
	}()
	_, err := c.List(ctx)
	if err == nil || calls.Load() != 1 {
		t.Fatalf("err = %v after %d calls; want an error after 1", err, calls.Load())
	}
}

func TestIsConnError(t *testing.T) {
	if isConnError(context.Canceled) || isConnError(errors.New("x509: unknown authority")) || isConnError(nil) {
		t.Error("non-connection errors classed as connection errors")
	}
}

func TestBackoffBounded(t *testing.T) {
	p := retryPolicy{attempts: 10, base: 100 * time.Millisecond, max: time.Second}
	for attempt := 1; attempt <= 64; attempt++ {
		if d := p.delay(attempt); d < 50*time.Millisecond || d >= 1500*time.Millisecond {
			t.Fatalf("delay(%d) = %v out of bounds", attempt, d)
		}
	}
}
