package testtool

import (
	"testing"
	"time"
)

// WaitFor polls cond until it holds, failing the test if within passes first: for state
// another goroutine or process reaches in its own time. The deadline only bounds a test
// that would otherwise hang; it asserts nothing about speed.
func WaitFor(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
