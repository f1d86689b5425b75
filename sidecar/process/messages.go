package process

import (
	"context"
	"sync"
)

// Output messages: what is already there when a message goes out is sent in it, so a
// fast stream goes out in fewer, larger messages (one header, one TLS record run and one
// write each) while a trickle still goes out at once: nothing ever waits for more output.
const (
	// CoalesceBytes: a message takes more output only while it is smaller than this.
	CoalesceBytes = 64 << 10
	// MaxMessageBytes bounds a message: the largest chunk Next returns (one pipe read),
	// so joining never makes a message larger than a chunk could be alone.
	MaxMessageBytes = readSize
)

// messageBufs hold joined messages until they are written.
var messageBufs = sync.Pool{New: func() any { b := make([]byte, 0, MaxMessageBytes); return &b }}

// Message is output for one message of a stream: bytes of one channel.
type Message struct {
	Channel byte
	Data    []byte  // read only; valid until Release
	buf     *[]byte // Data's pooled buffer when chunks were joined
}

// Release hands the message's buffer back once its bytes are written. Optional: an
// unreleased message is collected as garbage.
func (m Message) Release() {
	if m.buf != nil {
		*m.buf = (*m.buf)[:0]
		messageBufs.Put(m.buf)
	}
}

// Messages turns a subscription's chunks into messages: consecutive chunks of one
// channel that are already there are joined, up to CoalesceBytes; a chunk of the other
// channel, or one that would not fit, starts the next message. Bytes keep their order
// within and across channels: the messages carry exactly the stream the chunks make.
// Like Next, use it from one goroutine at a time.
type Messages struct {
	sub     *Subscription
	pending *Chunk // taken by a poll, for the next message
	end     error  // met by a poll; returned once what came before it is out
}

// NewMessages reads sub's output as messages.
func NewMessages(sub *Subscription) *Messages { return &Messages{sub: sub} }

// Next returns the next message. It blocks only for the message's first chunk, and
// returns Next's errors (io.EOF after the last message).
func (ms *Messages) Next(ctx context.Context) (Message, error) {
	first, err := ms.first(ctx)
	if err != nil {
		return Message{}, err
	}
	m := Message{Channel: first.Channel, Data: first.Data}
	for ms.end == nil && ms.pending == nil && len(m.Data) < CoalesceBytes {
		c, ok, err := ms.sub.Poll()
		if err != nil {
			ms.end = err
			break
		}
		if !ok {
			break
		}
		if c.Channel != m.Channel || len(m.Data)+len(c.Data) > MaxMessageBytes {
			ms.pending = &c
			break
		}
		if m.buf == nil {
			// Chunk bytes are shared with the replay buffer: never append to them.
			m.buf = messageBufs.Get().(*[]byte)
			m.Data = append((*m.buf)[:0], m.Data...)
		}
		m.Data = append(m.Data, c.Data...)
	}
	return m, nil
}

// first is the chunk a message starts with: the one a poll set aside, else the next.
func (ms *Messages) first(ctx context.Context) (Chunk, error) {
	if c := ms.pending; c != nil {
		ms.pending = nil
		return *c, nil
	}
	if ms.end != nil {
		return Chunk{}, ms.end
	}
	return ms.sub.Next(ctx)
}
