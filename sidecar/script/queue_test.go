package script

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// waitQueued polls until n callers wait for a worker.
func waitQueued(t *testing.T, r *Runner, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for int(r.queued.Load()) != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued = %d, want %d", int(r.queued.Load()), n)
		}
		time.Sleep(time.Millisecond) // polling a counter, not waiting for time to pass
	}
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
	for len(r.idle) != 0 || int(r.queued.Load()) != 0 { // the worker is taken
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
