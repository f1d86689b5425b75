package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// countedOutput is a process's output: numbered lines, so a gap or a repeat shows.
func countedOutput(lines int) []byte {
	var b bytes.Buffer
	for i := range lines {
		fmt.Fprintf(&b, "%06d\n", i)
	}
	return b.Bytes()
}

// fakeAttach serves …/attach for one process whose whole output is out. Its first
// connection breaks (no close frame) after cut bytes; when skip > 0 a reattach starts
// skip bytes later than asked, as if they had left the replay buffer.
type fakeAttach struct {
	t    *testing.T
	out  []byte
	cut  int
	skip int64
	// stderrEvery > 0 sends every n-th frame on stderr instead of stdout.
	stderrEvery int
	// frame is the payload size of an output frame; 0: 1000.
	frame       int
	mu          sync.Mutex
	sinces      []int64
	stdin       bytes.Buffer
	resize      []apitype.Resize
	stdinClosed bool
}

func (f *fakeAttach) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/leases/L1/processes/p1/attach" {
		writeProblem(w, 404, apitype.CodeProcessNotFound, "")
		return
	}
	since, _ := strconv.ParseInt(r.URL.Query().Get("since"), 10, 64)
	f.mu.Lock()
	f.sinces = append(f.sinces, since)
	first := len(f.sinces) == 1
	f.mu.Unlock()
	start, lost := since, int64(0)
	if !first && f.skip > 0 {
		start, lost = since+f.skip, f.skip
	}
	up := websocket.Upgrader{Subprotocols: []string{apitype.StreamProtocolV5}}
	h := http.Header{apitype.HeaderOutputOffset: {strconv.FormatInt(start, 10)}, apitype.HeaderBytesLost: {strconv.FormatInt(lost, 10)}}
	conn, err := up.Upgrade(w, r, h)
	if err != nil {
		f.t.Errorf("upgrade: %v", err)
		return
	}
	defer conn.Close()
	go f.readClient(conn)
	end := len(f.out)
	if first && f.cut > 0 {
		end = f.cut
	}
	frame := 1000 // not a divisor of the line length: cuts fall mid-line
	if f.frame > 0 {
		frame = f.frame
	}
	// Frames lie at fixed offsets of the output, as the daemon's chunks do: an attach
	// from inside one gets the rest of that frame first.
	for off, next := int(start), 0; off < end; off = next {
		next = min(off-off%frame+frame, end)
		ch := apitype.ChannelStdout
		if f.stderrEvery > 0 && (off/frame)%f.stderrEvery == f.stderrEvery-1 {
			ch = apitype.ChannelStderr
		}
		if err := conn.WriteMessage(websocket.BinaryMessage, append([]byte{ch}, f.out[off:next]...)); err != nil {
			return
		}
	}
	if first && f.cut > 0 {
		conn.UnderlyingConn().Close() // a dropped connection, not a close handshake
		return
	}
	st, _ := json.Marshal(apitype.Status{Status: apitype.StatusFailure, Reason: apitype.ReasonNonZeroExitCode, ExitCode: 3})
	_ = conn.WriteMessage(websocket.BinaryMessage, append([]byte{apitype.ChannelStatus}, st...))
	_ = conn.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""))
}

func (f *fakeAttach) readClient(conn *websocket.Conn) {
	for {
		_, b, err := conn.ReadMessage()
		if err != nil || len(b) == 0 {
			return
		}
		f.mu.Lock()
		switch b[0] {
		case apitype.ChannelStdin:
			f.stdin.Write(b[1:])
		case apitype.ChannelResize:
			var rs apitype.Resize
			_ = json.Unmarshal(b[1:], &rs)
			f.resize = append(f.resize, rs)
		case apitype.ChannelClose:
			f.stdinClosed = len(b) == 2 && b[1] == apitype.ChannelStdin
		}
		f.mu.Unlock()
	}
}

// readAll drains stdout and stderr concurrently, as a reader of both must.
func readAll(t *testing.T, p *Process) (stdout, stderr []byte) {
	t.Helper()
	var outs [2]bytes.Buffer
	var wg sync.WaitGroup
	for i, r := range []io.Reader{p.Stdout, p.Stderr} {
		wg.Go(func() {
			if _, err := io.Copy(&outs[i], r); err != nil {
				t.Errorf("read: %v", err)
			}
		})
	}
	wg.Wait()
	return outs[0].Bytes(), outs[1].Bytes()
}

func TestAttachReattachesAtExactOffset(t *testing.T) {
	out := countedOutput(20000) // 140 kB
	for _, cut := range []int{0, 1, 999, 1000, 70001, len(out) - 1} {
		t.Run(strconv.Itoa(cut), func(t *testing.T) {
			f := &fakeAttach{t: t, out: out, cut: cut}
			c, _ := newTestClient(t, f)
			p, err := c.OpenLease("L1", "tok").Attach(context.Background(), "p1", 0)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			got, _ := readAll(t, p)
			st, err := p.Wait(context.Background())
			if err != nil || st.ExitCode != 3 {
				t.Fatalf("status %+v err %v", st, err)
			}
			if !bytes.Equal(got, out) {
				t.Fatalf("got %d bytes, want %d: a gap or a repeat", len(got), len(out))
			}
			if p.Offset() != int64(len(out)) || p.Lost() != 0 {
				t.Fatalf("offset %d lost %d", p.Offset(), p.Lost())
			}
			if cut > 0 {
				f.mu.Lock()
				defer f.mu.Unlock()
				if len(f.sinces) != 2 || f.sinces[1] != int64(cut) {
					t.Fatalf("attach since values %v, want [0 %d]", f.sinces, cut)
				}
			}
		})
	}
}

func TestAttachCountsLostBytes(t *testing.T) {
	out := countedOutput(5000)
	f := &fakeAttach{t: t, out: out, cut: 7000, skip: 700}
	c, _ := newTestClient(t, f)
	p, err := c.OpenLease("L1", "tok").Attach(context.Background(), "p1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got, _ := readAll(t, p)
	if _, err := p.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{}, out[:7000]...), out[7700:]...)
	if p.Lost() != 700 || p.Offset() != int64(len(out)) || !bytes.Equal(got, want) {
		t.Fatalf("lost %d offset %d got %d bytes, want %d", p.Lost(), p.Offset(), len(got), len(want))
	}
}

// Stderr frames go to Stderr and count in the same offset sequence.
func TestAttachSplitsStderr(t *testing.T) {
	out := countedOutput(3000)
	f := &fakeAttach{t: t, out: out, cut: 5500, stderrEvery: 3}
	c, _ := newTestClient(t, f)
	p, err := c.OpenLease("L1", "tok").Attach(context.Background(), "p1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	stdout, stderr := readAll(t, p)
	if _, err := p.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(stderr) == 0 || len(stdout)+len(stderr) != len(out) || p.Offset() != int64(len(out)) {
		t.Fatalf("stdout %d + stderr %d bytes, offset %d; want %d in all", len(stdout), len(stderr), p.Offset(), len(out))
	}
}

func TestStdinResizeAndClose(t *testing.T) {
	f := &fakeAttach{t: t, out: nil}
	block := make(chan struct{})
	c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Hold the stream open until the client has sent everything.
		up := websocket.Upgrader{Subprotocols: []string{apitype.StreamProtocolV5}}
		conn, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer conn.Close()
		go f.readClient(conn)
		<-block
		st, _ := json.Marshal(apitype.Status{Status: apitype.StatusSuccess})
		_ = conn.WriteMessage(websocket.BinaryMessage, append([]byte{apitype.ChannelStatus}, st...))
	}))
	p, err := c.OpenLease("L1", "tok").Attach(context.Background(), "p1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	big := bytes.Repeat([]byte("x"), 3*maxStdinFrame+5)
	if _, err := p.Stdin.Write(big); err != nil {
		t.Fatal(err)
	}
	if err := p.Resize(40, 120); err != nil {
		t.Fatal(err)
	}
	if err := p.Stdin.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Stdin.Write([]byte("late")); err == nil {
		t.Fatal("write after close accepted")
	}
	eventually(t, "server saw stdin close", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.stdinClosed
	})
	close(block)
	st, err := p.Wait(context.Background())
	if err != nil || st.Status != apitype.StatusSuccess {
		t.Fatalf("status %+v err %v", st, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !bytes.Equal(f.stdin.Bytes(), big) || len(f.resize) != 1 || f.resize[0] != (apitype.Resize{Width: 120, Height: 40}) {
		t.Fatalf("stdin %d bytes, resize %+v", f.stdin.Len(), f.resize)
	}
}

func TestAttachErrors(t *testing.T) {
	c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, 404, apitype.CodeProcessNotFound, "")
	}))
	if _, err := c.OpenLease("L1", "tok").Attach(context.Background(), "nope", 0); !IsNotFound(err) {
		t.Fatalf("err = %v, want process_not_found", err)
	}
	c2, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := websocket.Upgrader{} // picks no subprotocol
		if conn, err := up.Upgrade(w, r, nil); err == nil {
			conn.Close()
		}
	}))
	if _, err := c2.OpenLease("L1", "tok").Attach(context.Background(), "p1", 0); err == nil {
		t.Fatal("attach without a subprotocol accepted")
	}
}

func TestCloseEndsWait(t *testing.T) {
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		up := websocket.Upgrader{Subprotocols: []string{apitype.StreamProtocolV5}}
		if conn, err := up.Upgrade(w, r, nil); err == nil {
			<-hold
			conn.Close()
		}
	}))
	p, err := c.OpenLease("L1", "tok").Attach(context.Background(), "p1", 0)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.Wait(ctx); err != ErrHandleClosed {
		t.Fatalf("Wait after Close: %v", err)
	}
}

// A lossless attach to a daemon that does not confirm the mode (one that predates it
// ignores ?lossless) is refused at once, not retried, and not silently lossy; one that
// confirms it is reported by Lossless.
func TestAttachLosslessNeedsTheDaemon(t *testing.T) {
	var dials int
	var mu sync.Mutex
	c, _ := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		dials++
		mu.Unlock()
		h := http.Header{}
		if r.URL.Query().Get("lossless") == "1" && r.URL.Query().Get("since") == "5" {
			h.Set(apitype.HeaderOutputMode, apitype.OutputModeLossless)
		}
		up := websocket.Upgrader{Subprotocols: []string{apitype.StreamProtocolV5}}
		conn, err := up.Upgrade(w, r, h)
		if err != nil {
			return
		}
		defer conn.Close()
		_ = conn.WriteMessage(websocket.BinaryMessage, append([]byte{apitype.ChannelStatus}, `{"status":"Success"}`...))
	}))
	l := c.OpenLease("L1", "tok")
	if _, err := l.AttachWith(context.Background(), "p1", AttachOptions{Lossless: true}); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("lossless attach to a daemon without the mode: %v", err)
	}
	if dials != 1 {
		t.Fatalf("%d dials: a refused mode was retried", dials)
	}
	p, err := l.AttachWith(context.Background(), "p1", AttachOptions{Since: 5, Lossless: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !p.Lossless() {
		t.Fatal("Lossless() = false on a confirmed lossless attach")
	}
}

// Offset is exact wherever a Read ends inside a frame: a handle that read k bytes (for
// every k, frames on stdout and stderr alike) reports offset k, and an attach from it
// returns exactly the rest, with no byte repeated.
func TestOffsetResumesAtEveryPosition(t *testing.T) {
	const frame, stderrEvery = 16, 2
	out := countedOutput(9) // 63 bytes: frames of 16, 16, 16 and 15, every second on stderr
	onStderr := func(off int) bool { return (off/frame)%stderrEvery == stderrEvery-1 }
	f := &fakeAttach{t: t, out: out, frame: frame, stderrEvery: stderrEvery}
	c, _ := newTestClient(t, f)
	lease := c.OpenLease("L1", "tok")
	for k := 0; k <= len(out); k++ {
		p, err := lease.Attach(context.Background(), "p1", 0)
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; off < k; {
			end := min(off-off%frame+frame, k)
			r := p.Stdout
			if onStderr(off) {
				r = p.Stderr
			}
			if _, err := io.ReadFull(r, make([]byte, end-off)); err != nil {
				t.Fatalf("k=%d: read at %d: %v", k, off, err)
			}
			off = end
		}
		if got := p.Offset(); got != int64(k) {
			t.Fatalf("after reading %d bytes Offset is %d", k, got)
		}
		p.Close()

		rest, err := lease.Attach(context.Background(), "p1", int64(k))
		if err != nil {
			t.Fatal(err)
		}
		stdout, stderr := readAll(t, rest)
		if _, err := rest.Wait(context.Background()); err != nil {
			t.Fatalf("k=%d: %v", k, err)
		}
		var wantOut, wantErr []byte
		for off := k; off < len(out); off++ {
			if onStderr(off) {
				wantErr = append(wantErr, out[off])
			} else {
				wantOut = append(wantOut, out[off])
			}
		}
		if !bytes.Equal(stdout, wantOut) || !bytes.Equal(stderr, wantErr) {
			t.Fatalf("resumed at %d: stdout %q stderr %q, want %q and %q", k, stdout, stderr, wantOut, wantErr)
		}
		if rest.Offset() != int64(len(out)) {
			t.Fatalf("resumed at %d: final offset %d, want %d", k, rest.Offset(), len(out))
		}
	}
}
