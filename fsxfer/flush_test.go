package fsxfer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// setFdatasync replaces the flusher's system call for one test.
func setFdatasync(t *testing.T, f func(fd int) error) {
	old := fdatasync
	fdatasync = f
	t.Cleanup(func() { fdatasync = old })
}

// gatedReader yields r, but stops after the first gate bytes until open is closed, and
// fails when that does not happen in time.
type gatedReader struct {
	r    io.Reader
	gate int64
	open chan struct{}
	read int64
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.read >= g.gate {
		select {
		case <-g.open:
		case <-time.After(30 * time.Second):
			return 0, errors.New("no flush while the stream was open")
		}
	} else if left := g.gate - g.read; int64(len(p)) > left {
		p = p[:left]
	}
	n, err := g.r.Read(p)
	g.read += int64(n)
	return n, err
}

// A big write is flushed to disk while it still streams in, not only by the final fsync:
// the reader holds back the rest of the file until a flush of the temporary file has run,
// and the file still ends whole and verified.
func TestBigWriteFlushesWhileStreaming(t *testing.T) {
	l := newTestLease(t)
	f := openFS(t, l.config())
	data := randomBytes(3*flushEvery/2, 3)
	sum := sha256.Sum256(data)
	open := make(chan struct{})
	flushedAt := int64(-1)
	setFdatasync(t, func(fd int) error {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		if flushedAt < 0 {
			flushedAt = st.Size
			close(open)
		}
		return unix.Fdatasync(fd)
	})
	r := &gatedReader{r: bytes.NewReader(data), gate: flushEvery, open: open}
	if _, err := f.WriteFile(context.Background(), "big", r, WriteOptions{SHA256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	if flushedAt != flushEvery {
		t.Fatalf("first flush saw a file of %d bytes, want %d (the part written so far)", flushedAt, flushEvery)
	}
	if got, err := os.ReadFile(filepath.Join(l.work, "big")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("file after the write: %d bytes, %v", len(got), err)
	}
}

// A background flush that fails fails the write (Linux reports a writeback error to one
// fsync only, so the final one would not see it): nothing is replaced, nothing is left.
func TestFailedFlushFailsWrite(t *testing.T) {
	for _, resumable := range []bool{false, true} {
		l := newTestLease(t)
		f := openFS(t, l.config())
		if err := os.WriteFile(filepath.Join(l.work, "big"), []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		setFdatasync(t, func(int) error { return unix.EIO })
		data := randomBytes(flushEvery+1, 4)
		var err error
		if resumable {
			_, err = f.AppendUpload(context.Background(), "big", 0, bytes.NewReader(data), true, WriteOptions{})
		} else {
			_, err = f.WriteFile(context.Background(), "big", bytes.NewReader(data), WriteOptions{})
		}
		if !errors.Is(err, unix.EIO) {
			t.Fatalf("resumable %v: write with a failing flush: %v, want EIO", resumable, err)
		}
		if got, _ := os.ReadFile(filepath.Join(l.work, "big")); string(got) != "old" {
			t.Fatalf("resumable %v: the old file was replaced (%d bytes)", resumable, len(got))
		}
		entries, _ := os.ReadDir(l.work)
		if len(entries) != 1 {
			t.Fatalf("resumable %v: workdir holds %d entries, want only the old file", resumable, len(entries))
		}
	}
}
