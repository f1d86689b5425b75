package process

import (
	"sort"
	"sync"
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
// produced, of which a bounded ring of the newest chunks is kept. Writers never wait for
// readers: a reader that falls behind the ring loses bytes, and that is counted.
type outLog struct {
	limit int64 // memory bound, see Config.BufferBytes

	mu     sync.Mutex
	chunks []chunk // live chunks are chunks[head:]
	head   int
	start  int64 // offset of the oldest byte kept
	end    int64 // offset after the newest byte
	used   int64 // memory held by the live chunks
	closed bool  // no more output will come
	wake   chan struct{}
}

func newOutLog(limit int64) *outLog { return &outLog{limit: limit} }

// write appends p (which the caller may reuse afterwards) on channel ch. It reports
// whether a waiting reader was woken.
func (l *outLog) write(ch byte, p []byte) (woke bool) {
	if len(p) == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
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

// trim drops whole oldest chunks until the log fits its bound; the newest chunk always
// stays (a chunk is at most readSize and the bound at least MinBufferBytes).
func (l *outLog) trim() {
	for l.used > l.limit && len(l.chunks)-l.head > 1 {
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
