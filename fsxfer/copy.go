package fsxfer

import (
	"bytes"
	"context"
	"errors"
	"hash"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// bufSize is the unit of streaming: large enough that one read and one write move a lot,
// small enough that memory stays flat whatever the size of the transfer.
const bufSize = 1 << 20

// bufPool reuses the streaming buffers: first-touch page faults are expensive (about
// 14 µs per page here), so a fresh 1 MiB buffer per request would cost more than the copy.
var bufPool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

func getBuf() *[]byte  { return bufPool.Get().(*[]byte) }
func putBuf(b *[]byte) { bufPool.Put(b) }

// zeroBlock is compared against to find holes; it is never written to.
var zeroBlock [4096]byte

// fileSink is what copyIn writes to: an *os.File, or a bare descriptor (rawFD).
type fileSink interface {
	WriteAt(b []byte, off int64) (int, error)
	Truncate(size int64) error
	Fd() uintptr // for the flusher
}

// copyIn streams src into dst from offset off on, reserving quota before each chunk, and
// returns the offset reached. All-zero 4 KiB blocks are skipped (left as holes), so
// sparse files stay sparse; dst is truncated to the final size so a trailing hole
// counts. When h is not nil the bytes are hashed in a second goroutine on the buffer
// just written while the next one is read: double buffering keeps hashing off the
// critical path. A big file is flushed to disk while it streams (see flusher), so the
// caller's fsync finds little left to do. A read error other than io.EOF is returned
// with the offset reached.
func copyIn(ctx context.Context, dst fileSink, off int64, src io.Reader, res *reservation, h hash.Hash) (_ int64, err error) {
	bufs := [2]*[]byte{getBuf(), getBuf()}
	defer putBuf(bufs[0])
	defer putBuf(bufs[1])
	fl := startFlusher(dst)
	defer func() {
		if ferr := fl.stop(); err == nil {
			err = ferr
		}
	}()

	var hashed chan []byte // buffers handed to the hasher
	var free chan int      // indexes of buffers the hasher is done with
	if h != nil {
		hashed = make(chan []byte)
		free = make(chan int, 2)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for b := range hashed {
				h.Write(b)
				free <- 0 // the value is irrelevant: buffers are used in turn
			}
		}()
		defer func() { close(hashed); <-done }()
		free <- 0
		free <- 0
	}

	written := off // the file's size as far as writes made it
	for i := 0; ; i ^= 1 {
		if h != nil {
			<-free // wait until the hasher is done with this buffer
		}
		if err := ctx.Err(); err != nil {
			return off, err
		}
		buf := *bufs[i]
		n, rerr := io.ReadFull(src, buf)
		if n > 0 {
			end, err := writeSparse(dst, buf[:n], off, res)
			if err != nil {
				return off, err
			}
			written = end
			off += int64(n)
			fl.wrote(n)
			if h != nil {
				hashed <- buf[:n]
			}
		} else if h != nil {
			free <- 0 // nothing handed over: the buffer is still free
		}
		switch {
		case rerr == nil:
			continue
		case errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF):
			if written < off { // a trailing hole: only the size says it is there
				if err := dst.Truncate(off); err != nil {
					return off, err
				}
			}
			return off, nil
		default:
			if written < off {
				_ = dst.Truncate(off) // keep the size honest for a resumable upload
			}
			return off, rerr
		}
	}
}

// writeSparse writes b at off, skipping all-zero 4 KiB blocks (aligned on the file), and
// reserves quota for what it writes. end is where the last write ended (off when all of
// b was a hole).
func writeSparse(dst fileSink, b []byte, off int64, res *reservation) (end int64, err error) {
	end = off
	for len(b) > 0 {
		// The block containing off ends at the next 4 KiB boundary.
		n := int(min(int64(len(b)), 4096-off%4096))
		if bytes.Equal(b[:n], zeroBlock[:n]) {
			b, off = b[n:], off+int64(n)
			continue
		}
		// Extend over following non-zero blocks to write them in one call.
		for n < len(b) {
			m := min(len(b)-n, 4096)
			if bytes.Equal(b[n:n+m], zeroBlock[:m]) {
				break
			}
			n += m
		}
		if res != nil {
			if err := res.grow(blockRound(int64(n))); err != nil {
				return end, err
			}
		}
		if _, err := dst.WriteAt(b[:n], off); err != nil {
			return end, err
		}
		b, off = b[n:], off+int64(n)
		end = off
	}
	return end, nil
}

// flushEvery is how far the data written may run ahead of the disk. The fsync before a
// write is acknowledged has to wait for every byte not yet on disk, and on a virtual disk
// even data the kernel already wrote back costs its share of the cache flush (a 256 MiB
// file written at 300 MB/s then fsynced: 150-250 ms; flushed every 16 MiB while it came
// in: under 1 ms left). Below it, a file is flushed by its final fsync alone.
const flushEvery = 16 << 20

// flusher runs fdatasync on a file in the background each time another flushEvery bytes
// have been written to it, one at a time (a flush asked for while one runs is dropped:
// the next covers it). It only moves work earlier: durability still comes from the
// caller's fsync. Linux reports a writeback error to one fsync of the file only, so an
// error seen here is kept and returned by stop.
type flusher struct {
	fd      int
	pending int64
	kick    chan struct{}
	done    chan struct{}
	err     error // set by the goroutine; read after done
}

// fdatasync is the flusher's system call; tests count or fail it.
var fdatasync = unix.Fdatasync

func startFlusher(f fileSink) *flusher { return &flusher{fd: int(f.Fd())} }

// wrote counts n more bytes written and starts a flush when flushEvery have piled up.
func (fl *flusher) wrote(n int) {
	fl.pending += int64(n)
	if fl.pending < flushEvery {
		return
	}
	fl.pending = 0
	if fl.kick == nil { // the first flush of a big file starts the goroutine
		fl.kick, fl.done = make(chan struct{}, 1), make(chan struct{})
		go fl.run()
	}
	select {
	case fl.kick <- struct{}{}:
	default: // one is queued already
	}
}

func (fl *flusher) run() {
	defer close(fl.done)
	for range fl.kick {
		if err := fdatasync(fl.fd); err != nil && fl.err == nil {
			fl.err = err
		}
	}
}

// stop waits for the flush in progress (the file may be closed after) and returns the
// first error a flush met.
func (fl *flusher) stop() error {
	if fl.kick == nil {
		return nil
	}
	close(fl.kick)
	<-fl.done
	return fl.err
}
