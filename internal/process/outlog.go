package process

import (
	"sort"
	"sync"
	"time"
)

// chunkOverhead is what one chunk costs beyond its bytes (its slot and slice header),
// counted against the buffer bound so that a flood of tiny writes stays bounded too.
const chunkOverhead = 64

// chunk is one run of bytes of one channel at a fixed offset. Its bytes never change
// once written; a chunk may only grow at its end, in place, while it is the newest.
type chunk struct {
	channel byte
	offset  int64
	data    []byte
}

// outLog is a process's output: one offset sequence over stdout and stderr in the order
// produced, of which a bounded ring of the newest chunks is kept. A lossy reader that
// falls behind the ring loses bytes, and that is counted. A lossless reader holds the
// bytes it has not read yet: a writer that would have to drop them waits instead, so the
// ring itself is the bounded queue between the pump and the slowest lossless reader, and
// the process blocks on its full pipe.
type outLog struct {
	limit int64           // memory bound, see Config.BufferBytes
	stop  <-chan struct{} // the Manager's shutdown: writers stop waiting for readers

	mu     sync.Mutex
	chunks []chunk // live chunks are chunks[head:]
	head   int
	start  int64 // offset of the oldest byte kept
	end    int64 // offset after the newest byte
	used   int64 // memory held by the live chunks
	closed bool  // no more output will come
	wake   chan struct{}

	holds    map[*hold]struct{} // lossless readers, and a Start's hold for its first one
	space    chan struct{}      // closed when a hold moves or goes, for a waiting writer
	released bool               // the run is done: writers never wait again
	waiting  int                // writers waiting for a hold now, see holding
	wakeAt   int64              // a waiting writer is woken once every hold reached this
	waited   bool               // a writer waited since the last holding
	fed      bool               // a write went in while held, since the last holding
}

// hold keeps the bytes from pos on in the ring.
type hold struct {
	pos     int64
	pending *time.Timer // a Start's hold until its first lossless Subscription; else nil
}

func newOutLog(limit int64, stop <-chan struct{}) *outLog {
	return &outLog{limit: limit, stop: stop}
}

// write appends p (which the caller may reuse afterwards) on channel ch. While a hold is
// behind, it first waits for room (see outLog); once released it no longer waits, and a
// lossless reader then loses what the ring drops, counted as for a lossy one. It reports
// whether a waiting reader was woken.
func (l *outLog) write(ch byte, p []byte) (woke bool) {
	if len(p) == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waitForRoom(int64(len(p)))
	l.fed = l.fed || len(l.holds) > 0 && !l.released
	n := len(l.chunks)
	if last := n - 1; last >= l.head && l.chunks[last].channel == ch && len(l.chunks[last].data)+len(p) <= readSize {
		// Coalesce small writes of one channel. Growing in place never touches bytes a
		// reader holds: readers only get slices capped at the length they saw.
		c := &l.chunks[last]
		before := cap(c.data)
		c.data = append(c.data, p...)
		l.used += int64(cap(c.data) - before)
	} else {
		data := append([]byte(nil), p...)
		l.chunks = append(l.chunks, chunk{channel: ch, offset: l.end, data: data})
		l.used += int64(cap(data)) + chunkOverhead
	}
	l.end += int64(len(p))
	l.trim()
	return l.signal()
}

// waitForRoom makes room for n more bytes without dropping a held byte, waiting (with mu
// released) while it cannot, until a hold moves or goes, or the log is released. Called
// with mu held.
func (l *outLog) waitForRoom(n int64) {
	for len(l.holds) > 0 && !l.released {
		keep := l.minHold()
		l.dropTo(l.limit-n-chunkOverhead, keep)
		// Every byte kept read by every hold: the chunk dropTo keeps as the newest may go
		// once this write is in, so there is nothing to wait for.
		if l.used+n+chunkOverhead <= l.limit || keep >= l.end {
			return
		}
		if l.space == nil {
			l.space = make(chan struct{})
		}
		// Wake once the readers freed half the buffer, not at every chunk they take:
		// a writer and reader handing single chunks back and forth cost a switch each.
		l.wakeAt = min(l.end, keep+l.limit/2)
		space := l.space
		l.waiting++
		l.waited = true
		l.mu.Unlock()
		select {
		case <-space:
		case <-l.stop:
		}
		l.mu.Lock()
		l.waiting--
		select {
		case <-l.stop:
			// Shutdown: subscriptions end, the process lives on; never block it again.
			l.released = true
		default:
		}
	}
}

// minHold is the lowest held offset: end with no hold, or once released. Called with mu
// held.
func (l *outLog) minHold() int64 {
	m := l.end
	if l.released {
		return m
	}
	for h := range l.holds {
		m = min(m, h.pos)
	}
	return m
}

// trim drops whole oldest chunks until the log fits its bound, never a held byte; the
// newest chunk always stays (a chunk is at most readSize and the bound at least
// MinBufferBytes). A write that had to wait for room leaves the log within its bound;
// one that coalesced may leave it over by the capacity its chunk grew by.
func (l *outLog) trim() { l.dropTo(l.limit, l.minHold()) }

// dropTo drops whole oldest chunks that end at or before keep until the live chunks
// hold at most bound bytes, the newest chunk excepted. Called with mu held.
func (l *outLog) dropTo(bound, keep int64) {
	for l.used > bound && len(l.chunks)-l.head > 1 && l.chunks[l.head].offset+int64(len(l.chunks[l.head].data)) <= keep {
		c := &l.chunks[l.head]
		l.used -= int64(cap(c.data)) + chunkOverhead
		*c = chunk{}
		l.head++
		l.start = l.chunks[l.head].offset
	}
	// Reclaim the dropped slots once they are the larger part of the slice.
	if l.head >= 64 && l.head*2 >= len(l.chunks) {
		n := copy(l.chunks, l.chunks[l.head:])
		clear(l.chunks[n:])
		l.chunks = l.chunks[:n]
		l.head = 0
	}
}

// addHold makes a new hold at pos. Called with mu held.
func (l *outLog) addHold(pos int64) *hold {
	if l.holds == nil {
		l.holds = map[*hold]struct{}{}
	}
	h := &hold{pos: pos}
	l.holds[h] = struct{}{}
	return h
}

// moveHold moves h forward to pos (a lossless reader got the bytes before it). Called
// with mu held.
func (l *outLog) moveHold(h *hold, pos int64) {
	if _, ok := l.holds[h]; !ok || pos <= h.pos {
		return
	}
	h.pos = pos
	if l.space != nil && l.minHold() >= l.wakeAt {
		l.freeSpace()
	}
}

// dropHold lets the bytes h kept go (a lossless reader left). Safe for a hold already gone.
func (l *outLog) dropHold(h *hold) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.holds[h]; ok {
		delete(l.holds, h)
		l.freeSpace()
	}
}

// holdFromStart keeps every byte from offset 0 for the process's first lossless
// Subscription (StartRequest.Lossless), or until wait passes without one.
func (l *outLog) holdFromStart(wait time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.addHold(0)
	h.pending = time.AfterFunc(wait, func() { l.dropHold(h) })
}

// subscribeHold makes the hold of a lossless Subscription at pos; it takes over from a
// Start's pending hold, if any. Called with mu held.
func (l *outLog) subscribeHold(pos int64) *hold {
	for h := range l.holds {
		if h.pending != nil {
			h.pending.Stop()
			delete(l.holds, h)
		}
	}
	h := l.addHold(pos)
	l.freeSpace()
	return h
}

// freeSpace wakes a writer waiting for room. Called with mu held.
func (l *outLog) freeSpace() {
	if l.space != nil {
		close(l.space)
		l.space = nil
	}
}

// releaseWriters ends all waiting for readers (the run is done): a waiting write goes
// in, and lossless readers behind lose what the ring drops, counted.
func (l *outLog) releaseWriters() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = true
	l.freeSpace()
}

// holding reports whether a writer waits for a lossless reader now, or waited for one
// or wrote while one held the log since the last call: after the main process exits,
// output keeps being collected while it does. A pump that waited for a reader must also
// be let finish once that reader keeps up again, or the tail still in the pipe is lost;
// a leftover that holds a pipe and writes nothing ends the collecting as without one.
func (l *outLog) holding() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	h := l.waiting > 0 || l.waited || l.fed
	l.waited, l.fed = false, false
	return h
}

// close marks the end of output: readers at the end get io.EOF.
func (l *outLog) close() {
	l.mu.Lock()
	l.closed = true
	l.signal()
	l.mu.Unlock()
}

// signal wakes every waiting reader. Called with mu held.
func (l *outLog) signal() (woke bool) {
	if l.wake == nil {
		return false
	}
	close(l.wake)
	l.wake = nil
	return true
}

// offsets reports the oldest kept and the next offset.
func (l *outLog) offsets() (start, end int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.start, l.end
}

// readAt returns the bytes from pos to the end of the chunk holding pos, with pos moved
// into the ring first (lost counts what was skipped). With nothing at pos, ok is false
// and wait is a channel closed at the next write or at close (nil once closed).
// Called with mu held.
func (l *outLog) readAt(pos int64) (c Chunk, lost int64, ok bool, wait <-chan struct{}) {
	if pos < l.start {
		lost = l.start - pos
		pos = l.start
	}
	if pos >= l.end {
		if l.closed {
			return Chunk{Offset: pos}, lost, false, nil
		}
		if l.wake == nil {
			l.wake = make(chan struct{})
		}
		return Chunk{Offset: pos}, lost, false, l.wake
	}
	live := l.chunks[l.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].offset > pos }) - 1
	ch := live[i]
	from := int(pos - ch.offset)
	return Chunk{Channel: ch.channel, Offset: pos, Data: ch.data[from:len(ch.data):len(ch.data)]}, lost, true, nil
}
