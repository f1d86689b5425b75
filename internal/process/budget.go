package process

import "sync/atomic"

// budget is the daemon-wide bound on the output that Execs hold in memory (their
// capture buffers, from the first byte kept until the reply is written). It never
// blocks: a capture that cannot get more is truncated, as at MaxOutputBytes.
type budget struct {
	free atomic.Int64
}

func newBudget(n int64) *budget {
	b := &budget{}
	b.free.Store(n)
	return b
}

// take grants n bytes, or what is left when that is less (possibly 0).
func (b *budget) take(n int64) int64 {
	for {
		free := b.free.Load()
		got := min(n, free)
		if got <= 0 {
			return 0
		}
		if b.free.CompareAndSwap(free, free-got) {
			return got
		}
	}
}

// give returns n bytes taken earlier.
func (b *budget) give(n int64) { b.free.Add(n) }
