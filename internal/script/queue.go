package script

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// ErrBusy is returned by Run when no worker came free for the request within
// Config.QueueWait (503 unavailable).
var ErrBusy = errors.New("script: every worker is busy")

// queue hands free workers to waiting callers: round robin between callers (a lease,
// or "" for the shared token), so that one caller's burst waits behind its own jobs, not
// in front of everyone's; first come first served within a caller; and never more than
// Config.MaxPerLease workers at once to one lease, so that a lease cannot hold every
// worker while others wait.
type queue struct {
	maxPerLease int
	// demand wakes a parked slot (Runner.keepSlot): a caller came that no idle worker
	// could take.
	demand chan struct{}

	mu      sync.Mutex
	idle    []*proc
	waiting map[string][]*waiter // callers' waiters in arrival order
	ring    []string             // callers with waiters, in turn order
	running map[string]int       // workers each caller holds
	nWait   int                  // waiters in total
}

type waiter struct {
	caller string
	capped bool
	got    chan *proc // receives the worker once; buffered
}

func newQueue(maxPerLease, workers int) *queue {
	return &queue{maxPerLease: maxPerLease, demand: make(chan struct{}, workers), waiting: map[string][]*waiter{}, running: map[string]int{}}
}

// get returns a worker for caller, waiting up to wait for one; ErrBusy when none came.
func (q *queue) get(ctx, closing context.Context, caller string, capped bool, wait time.Duration) (*proc, error) {
	w := &waiter{caller: caller, capped: capped, got: make(chan *proc, 1)}
	q.mu.Lock()
	q.waiting[caller] = append(q.waiting[caller], w)
	if len(q.waiting[caller]) == 1 {
		q.ring = append(q.ring, caller)
	}
	q.nWait++
	q.dispatchLocked()
	if len(w.got) == 0 {
		select { // a parked slot starts a worker; one signal per caller left waiting
		case q.demand <- struct{}{}:
		default:
		}
	}
	q.mu.Unlock()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var err error
	select {
	case p := <-w.got:
		return p, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-closing.Done():
		err = ErrClosed
	case <-timer.C:
		err = fmt.Errorf("%w: no worker came free within %v", ErrBusy, wait)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	select {
	case p := <-w.got: // handed over as we gave up: pass it on
		q.running[caller]--
		q.idleLocked(p)
		q.dispatchLocked()
	default:
		q.dropLocked(w)
	}
	return nil, err
}

// put returns caller's worker p; p nil when it was not healthy (its slot replaces it).
func (q *queue) put(caller string, p *proc) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.running[caller]--; q.running[caller] == 0 {
		delete(q.running, caller)
	}
	if p != nil {
		q.idleLocked(p)
	}
	q.dispatchLocked()
}

// offer adds a fresh worker.
func (q *queue) offer(p *proc) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.idleLocked(p)
	q.dispatchLocked()
}

// idleLocked adds p to the idle workers, noting since when it is idle.
func (q *queue) idleLocked(p *proc) {
	p.idleSince = time.Now()
	q.idle = append(q.idle, p)
}

// dispatchLocked hands idle workers to waiters in turn: each pass over the ring gives at
// most one worker to each caller, skipping capped callers at their limit.
func (q *queue) dispatchLocked() {
	for len(q.idle) > 0 {
		i := slices.IndexFunc(q.ring, q.eligibleLocked)
		if i < 0 {
			return
		}
		caller := q.ring[i]
		w := q.waiting[caller][0]
		p := q.idle[0]
		q.idle = q.idle[1:]
		q.running[caller]++
		q.dropLocked(w)
		// Its next waiter, if any, goes to the back of the ring: the others come first.
		if j := slices.Index(q.ring, caller); j >= 0 {
			q.ring = append(slices.Delete(q.ring, j, j+1), caller)
		}
		w.got <- p
	}
}

func (q *queue) eligibleLocked(caller string) bool {
	w := q.waiting[caller][0]
	return !w.capped || q.running[caller] < q.maxPerLease
}

// dropLocked removes w from its caller's waiters, and the caller from the ring when it
// has none left.
func (q *queue) dropLocked(w *waiter) {
	ws := q.waiting[w.caller]
	i := slices.Index(ws, w)
	if i < 0 {
		return
	}
	q.nWait--
	if ws = slices.Delete(ws, i, i+1); len(ws) > 0 {
		q.waiting[w.caller] = ws
		return
	}
	delete(q.waiting, w.caller)
	if j := slices.Index(q.ring, w.caller); j >= 0 {
		q.ring = slices.Delete(q.ring, j, j+1)
	}
}

// remove takes p out of the idle workers, if it is there.
func (q *queue) remove(p *proc) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if i := slices.Index(q.idle, p); i >= 0 {
		q.idle = slices.Delete(q.idle, i, i+1)
	}
}

// retire takes p out of the idle workers if it has been idle since before cutoff, and
// says whether it did: a worker in use, or used since, stays.
func (q *queue) retire(p *proc, cutoff time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.Index(q.idle, p)
	if i < 0 || p.idleSince.After(cutoff) {
		return false
	}
	q.idle = slices.Delete(q.idle, i, i+1)
	return true
}

// waiters reports whether any caller waits for a worker.
func (q *queue) waiters() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.nWait > 0
}

// counts reports idle workers and waiting callers (for tests).
func (q *queue) counts() (idle, waiting int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.idle), q.nWait
}
