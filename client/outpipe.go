package client

import (
	"io"
	"sync"
	"sync/atomic"
)

// outPipe is a synchronous pipe, as io.Pipe, from the frame reader to Stdout or Stderr,
// whose Read advances the handle's output offset by what it returns before the writer
// learns the bytes were taken. So Offset is never behind a Read that returned (resuming
// from it repeats nothing), and a reattach, which starts after the last Write returned,
// starts from an offset that counts every byte delivered.
type outPipe struct {
	offset *atomic.Int64
	wrCh   chan []byte
	rdCh   chan int
	done   chan struct{}
	once   sync.Once
	err    error // what Read returns once done is closed
}

func newOutPipe(offset *atomic.Int64) *outPipe {
	return &outPipe{offset: offset, wrCh: make(chan []byte), rdCh: make(chan int), done: make(chan struct{})}
}

// Read takes what one write offers, at most len(b) bytes, counting them in the offset.
func (p *outPipe) Read(b []byte) (int, error) {
	select {
	case <-p.done:
		return 0, p.err
	default:
	}
	select {
	case bw := <-p.wrCh:
		n := copy(b, bw)
		p.offset.Add(int64(n))
		p.rdCh <- n
		return n, nil
	case <-p.done:
		return 0, p.err
	}
}

// write returns once readers took all of b, or with io.ErrClosedPipe once the pipe is closed.
func (p *outPipe) write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		select {
		case p.wrCh <- b:
			nr := <-p.rdCh
			b, n = b[nr:], n+nr
		case <-p.done:
			return n, io.ErrClosedPipe
		}
	}
	return n, nil
}

// closeWithError ends the pipe: reads return err, or io.EOF when err is nil.
func (p *outPipe) closeWithError(err error) {
	p.once.Do(func() {
		if err == nil {
			err = io.EOF
		}
		p.err = err
		close(p.done)
	})
}
