package client

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"time"
)

// retryPolicy bounds retries: attempts in all, exponential backoff from base capped at
// max, with jitter so that many clients cut off together do not come back together.
type retryPolicy struct {
	attempts int
	base     time.Duration
	max      time.Duration
}

var (
	defaultRetry    = retryPolicy{attempts: 3, base: 200 * time.Millisecond, max: 2 * time.Second}
	defaultReattach = retryPolicy{attempts: 6, base: 250 * time.Millisecond, max: 5 * time.Second}
)

// delay is the pause after the given failed attempt (1-based): base·2^(attempt-1),
// capped, then scaled by a random factor in [0.5, 1.5).
func (p retryPolicy) delay(attempt int) time.Duration {
	d := p.base << min(attempt-1, 20)
	if d > p.max || d <= 0 {
		d = p.max
	}
	return time.Duration(float64(d) * (0.5 + rand.Float64()))
}

// wait pauses after a failed attempt, or returns ctx's error when it ends first.
func (p retryPolicy) wait(ctx context.Context, attempt int) error {
	t := time.NewTimer(p.delay(attempt))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// isConnError reports whether err is a transport failure worth retrying: the connection
// was refused, reset or closed before a complete response. TLS verification failures and
// cancellations are not.
func isConnError(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	for _, e := range []error{io.EOF, io.ErrUnexpectedEOF, net.ErrClosed, syscall.ECONNREFUSED,
		syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE} {
		if errors.Is(err, e) {
			return true
		}
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
