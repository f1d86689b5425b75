package process

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// randomStream starts a process that writes n random bytes to stdout and a copy to a
// file, and returns the process and the file's path (to compare with once it ended).
func randomStream(t *testing.T, m *Manager, n int, lossless bool) (*Process, string) {
	t.Helper()
	copyPath := filepath.Join(t.TempDir(), "sent")
	script := "head -c " + strconv.Itoa(n) + " /dev/urandom | tee \"$0\""
	return start(t, m, StartRequest{Spec: Spec{Argv: []string{"sh", "-c", script, copyPath}}, Lossless: lossless}), copyPath
}

// writerWaiting reports whether the pump waits for a lossless reader now.
func writerWaiting(p *Process) bool {
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	return p.log.waiting > 0
}

// A lossless subscriber that reads slowly gets every byte; the process is held back by
// it (it cannot have written more than the buffer ahead, nor ended, while the subscriber
// has not read); a lossy subscriber beside it still gets consistent bytes, and counts
// what it lost.
func TestLosslessSlowReaderGetsEverything(t *testing.T) {
	const buffer = 256 << 10
	const total = 8 << 20
	m := newManager(t, Config{BufferBytes: buffer})
	p, copyPath := randomStream(t, m, total, false)
	slow, err := p.SubscribeLossless(0)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if !slow.Lossless() {
		t.Fatal("SubscribeLossless gave a lossy subscription")
	}
	lossy, err := p.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	defer lossy.Close()
	lossyDone := make(chan error, 1)
	var lossyGot []Chunk
	go func() {
		for {
			c, err := lossy.Next(context.Background())
			if err != nil {
				lossyDone <- err
				return
			}
			lossyGot = append(lossyGot, c)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var got bytes.Buffer
	held := 0
	for {
		// Every 1 MiB, stop and check the process is held back by this reader.
		if got.Len() >= held*(1<<20) && held < 4 {
			held++
			waitFor(t, "the pump to wait for the lossless reader", func() bool { return writerWaiting(p) })
			st := p.Status()
			if st.State != "running" {
				t.Fatalf("process %s with %d of %d bytes read: not held back", st.State, got.Len(), total)
			}
			// Ahead of the reader by at most the buffer (plus the chunk it waits to add).
			if ahead := st.OutputOffset - int64(got.Len()); ahead > buffer+readSize {
				t.Fatalf("process wrote %d bytes ahead of the lossless reader, buffer %d", ahead, buffer)
			}
		}
		c, err := slow.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if c.Offset != int64(got.Len()) {
			t.Fatalf("chunk at %d after %d bytes", c.Offset, got.Len())
		}
		got.Write(c.Data)
	}
	waitDone(t, p)
	sent, err := os.ReadFile(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(sent) != total || !bytes.Equal(got.Bytes(), sent) || slow.Lost() != 0 {
		t.Fatalf("lossless reader got %d bytes (lost %d), equal %v; the process sent %d", got.Len(), slow.Lost(), bytes.Equal(got.Bytes(), sent), len(sent))
	}
	if err := <-lossyDone; !errors.Is(err, io.EOF) {
		t.Fatalf("lossy subscriber: %v", err)
	}
	var lossyBytes int64
	for _, c := range lossyGot {
		if !bytes.Equal(c.Data, sent[c.Offset:c.Offset+int64(len(c.Data))]) {
			t.Fatalf("lossy subscriber: wrong bytes at %d", c.Offset)
		}
		lossyBytes += int64(len(c.Data))
	}
	if lossyBytes+lossy.Lost() != total {
		t.Fatalf("lossy subscriber got %d and lost %d of %d", lossyBytes, lossy.Lost(), total)
	}
}

// After the main process exits, output still goes to a lossless reader past
// outputGrace: while the pump waits for that reader, and then while the reader takes
// the rest at its own pace. The stream comes from a process the main one leaves behind,
// so that more of it is outstanding at the exit than the buffer holds; the main process
// exits once the test closes its stdin, with the pump waiting.
func TestLosslessTailAfterExit(t *testing.T) {
	const buffer = 256 << 10
	const total = 2 << 20
	m := newManager(t, Config{BufferBytes: buffer})
	copyPath := filepath.Join(t.TempDir(), "sent")
	script := "head -c " + strconv.Itoa(total) + ` /dev/urandom | tee "$0" & read -r x`
	p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"sh", "-c", script, copyPath}}, Lossless: true, Stdin: true})
	sub, err := p.SubscribeLossless(0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	waitFor(t, "the pump to wait for the lossless reader", func() bool { return writerWaiting(p) })
	if err := p.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the main process to exit", func() bool {
		select {
		case <-p.run.exited:
			return true
		default:
			return false
		}
	})
	// Not a wait for a state: the reader stays away for longer than the grace on purpose.
	time.Sleep(3 * outputGrace)
	got := readAll(t, sub)
	sent, err := os.ReadFile(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(sent) != total || !bytes.Equal(got, sent) || sub.Lost() != 0 {
		t.Fatalf("got %d of %d bytes (lost %d), the process sent %d", len(got), total, sub.Lost(), len(sent))
	}
}

// Closing a lossless subscription that read nothing lets the process run to its end.
func TestLosslessCloseReleases(t *testing.T) {
	const total = 4 << 20
	m := newManager(t, Config{BufferBytes: MinBufferBytes})
	p, _ := randomStream(t, m, total, false)
	sub, err := p.SubscribeLossless(0)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pump to wait for the lossless reader", func() bool { return writerWaiting(p) })
	if st := p.Status(); st.State != "running" || st.OutputOffset >= total {
		t.Fatalf("not held back: %+v", st)
	}
	sub.Close()
	waitDone(t, p)
	if st := p.Status(); st.OutputOffset != total || *st.ExitCode != 0 {
		t.Fatalf("after the lossless reader left: %+v", st)
	}
}

// StartRequest.Lossless keeps the output from byte 0 for the first lossless subscriber,
// even when it comes after the process filled the buffer; a lossy one does not take the
// hold over.
func TestLosslessFromStart(t *testing.T) {
	const total = 4 << 20
	m := newManager(t, Config{BufferBytes: MinBufferBytes})
	p, copyPath := randomStream(t, m, total, true)
	waitFor(t, "the pump to wait for the first lossless reader", func() bool { return writerWaiting(p) })
	lossy, err := p.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	lossy.Close()
	if st := p.Status(); st.State != "running" || st.OutputStart != 0 {
		t.Fatalf("a lossy subscriber let the start's hold go: %+v", st)
	}
	sub, err := p.SubscribeLossless(0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	got := readAll(t, sub)
	sent, err := os.ReadFile(copyPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, sent) || len(got) != total || sub.Lost() != 0 {
		t.Fatalf("got %d of %d bytes (lost %d)", len(got), len(sent), sub.Lost())
	}
}

// holding, which keeps a run collecting output after its main process exited, tells
// output that still flows to a lossless reader (which a pump that once waited for it
// must be let finish) from a pipe that only a silent leftover keeps open, and from
// output with no lossless reader at all.
func TestLosslessHoldingSeesOutputFlow(t *testing.T) {
	l := newOutLog(MinBufferBytes, nil)
	block := make([]byte, 4<<10)
	l.write(1, block)
	if l.holding() {
		t.Fatal("holding with no lossless reader")
	}
	l.mu.Lock()
	h := l.addHold(l.end) // a reader that has read everything so far
	l.mu.Unlock()
	if l.holding() {
		t.Fatal("holding with nothing written since the reader came")
	}
	l.write(1, block) // room to spare: the writer does not wait
	if !l.holding() {
		t.Fatal("not holding while output flows to a lossless reader")
	}
	if l.holding() {
		t.Fatal("still holding with nothing written since the last call")
	}
	l.dropHold(h)
	l.write(1, block)
	if l.holding() {
		t.Fatal("holding after the lossless reader left")
	}
}

// A start's hold that no lossless subscriber takes over goes after its wait.
func TestLosslessStartHoldExpires(t *testing.T) {
	l := newOutLog(MinBufferBytes, nil)
	l.holdFromStart(time.Millisecond)
	waitFor(t, "the start's hold to go", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.holds) == 0
	})
	// With no hold, writes never wait: far more than the buffer goes through.
	block := make([]byte, readSize)
	for range 64 {
		l.write(1, block)
	}
	if start, end := l.offsets(); end != 64*readSize || start == 0 {
		t.Fatalf("start %d end %d", start, end)
	}
}

// Shutdown lets a process held by a lossless subscriber go on (the daemon stops; the
// process lives on until its lease is torn down).
func TestLosslessShutdownReleases(t *testing.T) {
	const total = 4 << 20
	m := newManager(t, Config{BufferBytes: MinBufferBytes})
	p, _ := randomStream(t, m, total, false)
	sub, err := p.SubscribeLossless(0)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	waitFor(t, "the pump to wait for the lossless reader", func() bool { return writerWaiting(p) })
	m.Shutdown(t.Context())
	waitDone(t, p)
	if st := p.Status(); st.OutputOffset != total {
		t.Fatalf("after shutdown: %+v", st)
	}
}
