package process

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// stdinState is the input side of a run.
type stdinState struct {
	mu          sync.Mutex // serialises TTY writes with the EOF that CloseStdin sends
	closed      bool
	atLineStart bool // the last byte written to a TTY ended a line (or none was written)
}

// stdinWriter adapts writeStdin to io.Writer for feed.
type stdinWriter struct{ r *run }

func (w stdinWriter) Write(b []byte) (int, error) { return w.r.writeStdin(b) }

func (r *run) writeStdin(b []byte) (int, error) {
	if r.stdin == nil {
		return 0, ErrStdinClosed
	}
	if r.pty != nil {
		// Held across the write so that CloseStdin's EOF comes after every byte written
		// before it; closing the master at the end of the run unblocks a stuck write.
		r.in.mu.Lock()
		defer r.in.mu.Unlock()
		if r.in.closed {
			return 0, ErrStdinClosed
		}
		n, err := r.stdin.Write(b)
		if n > 0 {
			last := b[n-1]
			r.in.atLineStart = last == '\n' || last == '\r'
		}
		return n, stdinError(err)
	}
	r.in.mu.Lock()
	closed := r.in.closed
	r.in.mu.Unlock()
	if closed {
		return 0, ErrStdinClosed
	}
	// Not under the lock: a pipe write blocks while the process does not read, and
	// CloseStdin must still be able to close it (which fails the write).
	n, err := r.stdin.Write(b)
	return n, stdinError(err)
}

func stdinError(err error) error {
	if errors.Is(err, os.ErrClosed) {
		return ErrStdinClosed
	}
	if err != nil {
		return fmt.Errorf("process: writing stdin: %w", err)
	}
	return nil
}

// closeStdin ends the input. A pipe is closed, so the process reads EOF. A TTY cannot
// be closed without hanging up the terminal, so the terminal's EOF character (VEOF,
// normally ^D) is written instead: at the start of a line the line discipline turns it
// into EOF for the reader; after a partial line the first one only flushes that line,
// so then a second is sent. In raw (non-canonical) mode the program just receives the
// character(s), as if a user typed ^D. Calling it again is a no-op.
func (r *run) closeStdin() error {
	if r.stdin == nil {
		return ErrStdinClosed
	}
	r.in.mu.Lock()
	defer r.in.mu.Unlock()
	if r.in.closed {
		return nil
	}
	r.in.closed = true
	if r.pty == nil {
		// Already closed by the run's end (wait): the input is over either way.
		if err := r.stdin.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			return err
		}
		return nil
	}
	eof := byte(4) // ^D
	if rc, err := r.pty.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			if t, err := unix.IoctlGetTermios(int(fd), unix.TCGETS); err == nil && t.Cc[unix.VEOF] != 0 {
				eof = t.Cc[unix.VEOF]
			}
		})
	}
	seq := []byte{eof}
	if !r.in.atLineStart {
		seq = append(seq, eof)
	}
	if _, err := r.stdin.Write(seq); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("process: sending EOF: %w", err)
	}
	return nil
}
