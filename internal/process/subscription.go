package process

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
)

// Chunk is a run of output bytes of one channel.
type Chunk struct {
	// Channel is apitype.ChannelStdout or apitype.ChannelStderr; a TTY has only stdout.
	Channel byte
	// Offset of Data[0] in the process's output.
	Offset int64
	// Data is shared with the replay buffer and other subscribers: read it, never
	// modify it. It stays valid after the next call.
	Data []byte
}

// Subscription reads a process's output at its own pace. Next and Close may be called
// from different goroutines; Next itself from one goroutine at a time.
type Subscription struct {
	log  *outLog
	pos  int64 // next offset to deliver; owned by the goroutine calling Next
	lost atomic.Int64
	stop <-chan struct{} // the Manager's shutdown
	hold *hold           // a lossless subscription's: the bytes from pos on stay

	closeOnce sync.Once
	closed    chan struct{}
}

// Lost reports how many bytes of the range this subscription asked for had left the
// buffer before it could deliver them.
func (s *Subscription) Lost() int64 { return s.lost.Load() }

// Offset is the offset of the next byte Next will deliver (or would, had it not left
// the buffer): after Subscribe, where this attachment starts. Like Next, call it from
// one goroutine at a time.
func (s *Subscription) Offset() int64 { return s.pos }

// Next blocks for the next chunk. It returns io.EOF after the last byte of a process
// that has ended, ctx's error when ctx ends, and ErrClosed after Close or the Manager's
// Shutdown. A subscriber whose next offset left the ring jumps to the oldest byte kept
// and Lost grows by the bytes skipped.
func (s *Subscription) Next(ctx context.Context) (Chunk, error) {
	for {
		select {
		case <-s.closed:
			return Chunk{}, ErrClosed
		default:
		}
		s.log.mu.Lock()
		if s.hold != nil {
			// What the last call returned has been handed on: let it go.
			s.log.moveHold(s.hold, s.pos)
		}
		c, lost, ok, wait := s.log.readAt(s.pos)
		s.log.mu.Unlock()
		if lost > 0 {
			s.lost.Add(lost)
		}
		s.pos = c.Offset
		if ok {
			s.pos += int64(len(c.Data))
			return c, nil
		}
		if wait == nil {
			return Chunk{}, io.EOF
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return Chunk{}, ctx.Err()
		case <-s.closed:
			return Chunk{}, ErrClosed
		case <-s.stop:
			return Chunk{}, ErrClosed
		}
	}
}

// Lossless reports whether the process waits for this subscription rather than drop
// bytes it has not read (SubscribeLossless).
func (s *Subscription) Lossless() bool { return s.hold != nil }

// Close ends the subscription; a blocked Next returns ErrClosed, and a process waiting
// for this lossless subscription goes on. It is safe to call more than once.
func (s *Subscription) Close() {
	s.closeOnce.Do(func() {
		close(s.closed)
		if s.hold != nil {
			s.log.dropHold(s.hold)
		}
	})
}
