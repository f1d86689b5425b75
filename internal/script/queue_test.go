package script

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// waitQueued polls until n callers wait for a worker.
func waitQueued(t *testing.T, r *Runner, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, waiting := r.q.counts(); waiting != n; _, waiting = r.q.counts() {
		if time.Now().After(deadline) {
			t.Fatalf("queued = %d, want %d", waiting, n)
		}
		time.Sleep(time.Millisecond) // polling a counter, not waiting for time to pass
	}
}

// allTaken says whether every worker is busy and no caller waits.
func allTaken(r *Runner) bool {
	idle, waiting := r.q.counts()
	return idle == 0 && waiting == 0
}

func TestQueueIsFairAndCancellable(t *testing.T) {
	r := newRunner(t, func(c *Config) { c.Workers = 1 })
	expectRecovered(t, r) // the worker is warm

	// Hold the only worker with a script that spins until its timeout.
	hold := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), Request{Source: `function transform() { for (;;) {} }`, Timeout: time.Second})
		hold <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !allTaken(r) { // the worker is taken
		if time.Now().After(deadline) {
			t.Fatal("the holding script never got the worker")
		}
		time.Sleep(time.Millisecond)
	}

	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	cancelCtx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan error, 1)
	for i := range 4 {
		if i == 2 { // a caller that gives up while queued
			go func() {
				_, err := r.Run(cancelCtx, Request{Source: okScript, Input: []byte("0")})
				cancelled <- err
			}()
			waitQueued(t, r, i+1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.Run(context.Background(), Request{Source: okScript, Input: fmt.Appendf(nil, "%d", i), Timeout: 5 * time.Second})
			if err != nil {
				t.Errorf("caller %d: %v", i, err)
				return
			}
			if string(res.Result) != fmt.Sprint(i+1) {
				t.Errorf("caller %d got %s", i, res.Result)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}()
		waitQueued(t, r, i+1)
	}
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled caller: %v", err)
	}
	waitQueued(t, r, 3)
	if err := <-hold; err == nil {
		t.Error("the spinning script did not time out")
	}
	wg.Wait()
	if fmt.Sprint(order) != "[0 1 3]" {
		t.Errorf("served in order %v, want [0 1 3]", order)
	}
}

func TestConcurrentCallers(t *testing.T) {
	r := newRunner(t, nil)
	var wg sync.WaitGroup
	for c := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				want := c*100 + i
				res, err := r.Run(context.Background(), Request{Source: okScript, Input: fmt.Appendf(nil, "%d", want-1)})
				if err != nil || string(res.Result) != fmt.Sprint(want) {
					t.Errorf("caller %d run %d: %s, %v", c, i, res.Result, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// One lease's endless scripts hold at most MaxPerLease workers (half the pool): a script
// of the shared token, sent after four of them, runs on the other worker and returns
// while all four are still queued or running.
func TestLeaseCannotHoldEveryWorker(t *testing.T) {
	r := newRunner(t, func(c *Config) { c.Workers = 2 })
	expectRecovered(t, r)
	var ended atomic.Int64
	var wg sync.WaitGroup
	// Cancelled once the check is done: run out one after the other, their timeouts
	// would add up.
	greedy, stop := context.WithCancel(context.Background())
	defer wg.Wait()
	defer stop()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = r.Run(greedy, Request{Source: `function transform() { for (;;) {} }`, Timeout: 10 * time.Second, Lease: "greedy"})
			ended.Add(1)
		}()
	}
	waitQueued(t, r, 3) // one runs, three wait: the lease's cap, not the pool, holds them
	res, err := r.Run(context.Background(), Request{Source: okScript, Input: []byte("1")})
	if err != nil || string(res.Result) != "2" {
		t.Fatalf("shared-token script: %s, %v", res.Result, err)
	}
	if n := ended.Load(); n != 0 {
		t.Errorf("the shared-token script waited for %d of the lease's endless scripts to end", n)
	}
}

// Callers take turns: with the worker held, a lease's two queued scripts and then
// another lease's one are served one of each lease in turn, not in arrival order.
func TestQueueTakesTurnsBetweenLeases(t *testing.T) {
	r := newRunner(t, func(c *Config) { c.Workers = 1 })
	expectRecovered(t, r)
	hold := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), Request{Source: `function transform() { for (;;) {} }`, Timeout: time.Second, Lease: "a"})
		hold <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !allTaken(r) {
		if time.Now().After(deadline) {
			t.Fatal("the holding script never got the worker")
		}
		time.Sleep(time.Millisecond)
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for i, c := range []struct{ lease, name string }{{"a", "a2"}, {"a", "a3"}, {"b", "b1"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.Run(context.Background(), Request{Source: okScript, Input: []byte("1"), Lease: c.lease}); err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			mu.Lock()
			order = append(order, c.name)
			mu.Unlock()
		}()
		waitQueued(t, r, i+1)
	}
	<-hold
	wg.Wait()
	if fmt.Sprint(order) != "[a2 b1 a3]" {
		t.Errorf("served in order %v, want [a2 b1 a3]", order)
	}
}

// The wait for a worker is bounded on its own: past QueueWait, Run gives up with
// ErrBusy instead of spending the script's own time in the queue.
func TestQueueWaitIsBounded(t *testing.T) {
	r := newRunner(t, func(c *Config) { c.Workers = 1 })
	expectRecovered(t, r)
	wait := r.cfg.QueueWait
	r.cfg.QueueWait = 100 * time.Millisecond // the worker is warm: nothing else reads it now
	hold := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), Request{Source: `function transform() { for (;;) {} }`, Timeout: 5 * time.Second})
		hold <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !allTaken(r) {
		if time.Now().After(deadline) {
			t.Fatal("the holding script never got the worker")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := r.Run(context.Background(), Request{Source: okScript, Input: []byte("1")}); !errors.Is(err, ErrBusy) {
		t.Errorf("with the only worker held: %v, want ErrBusy", err)
	}
	<-hold
	r.cfg.QueueWait = wait // the replacement worker may take longer to start
	expectRecovered(t, r)
}

// Only the first worker is kept while the runner is quiet: the others start when callers
// need them and are retired once idle for WorkerIdle.
func TestWorkersBeyondTheFirstOnDemand(t *testing.T) {
	r := newRunner(t, func(c *Config) { c.Workers = 3; c.WorkerIdle = 200 * time.Millisecond })
	expectRecovered(t, r)
	live := func() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.live) }
	if n := live(); n != 1 {
		t.Fatalf("%d workers after one script, want 1", n)
	}
	// Three scripts at once: two more workers start for them.
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.Run(context.Background(), Request{Source: `function transform(x) { const end = Date.now() + 1500; while (Date.now() < end) {} return x + 1 }`, Input: []byte("1"), Timeout: 20 * time.Second})
			if err != nil || string(res.Result) != "2" {
				t.Errorf("script: %s, %v", res.Result, err)
			}
		}()
	}
	waitFor(t, "three workers", func() bool { return live() == 3 })
	wg.Wait()
	waitFor(t, "the extra workers retired", func() bool { return live() == 1 })
	expectRecovered(t, r) // the first one still serves
}

// A daemon's first script waits while the first worker compiles QuickJS into an empty
// cache and one that loads the cache takes its place; it takes that one, and no other
// slot starts a worker for it.
func TestFirstScriptStartsOneWorker(t *testing.T) {
	cache, err := os.MkdirTemp("", "sidecar-script-emptycache-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(cache) })
	r := newRunner(t, func(c *Config) { c.CacheDir = cache; c.Workers = 3 })
	if res, err := run(t, r, `function transform(x) { return x + 1 }`, "1"); err != nil || string(res.Result) != "2" {
		t.Fatalf("script: %s, %v", res.Result, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if n := r.seq.Load(); n != 2 {
		t.Errorf("%d workers started, want 2: the one that compiled and the one in its place", n)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testtool.WaitFor(t, what, 30*time.Second, cond)
}
