package daemon_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
)

// Lossless attach (?lossless=1), against the real daemon over real TLS websockets.

const losslessBuffer = 256 << 10 // the daemon's replay buffer in these tests

// heldBound is how far a process may get ahead of a lossless viewer that reads slowly:
// the replay buffer, the frames queued for the one writer (16 of at most one chunk), the
// websocket buffers and what the kernel's TCP buffers take (their autotuning maxima).
func heldBound(t *testing.T) int64 {
	t.Helper()
	bound := int64(losslessBuffer + 16*(256<<10) + 4*(64<<10))
	for _, f := range []string{"/proc/sys/net/ipv4/tcp_wmem", "/proc/sys/net/ipv4/tcp_rmem"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fields := strings.Fields(string(b))
		max, err := strconv.ParseInt(fields[len(fields)-1], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		bound += max
	}
	return bound
}

// randomOut starts a process that writes n random bytes to stdout and to file out in
// its workdir, with its output held from byte 0 for the first lossless attach
// (StartRequest.Lossless), without attaching to it.
func randomOut(t *testing.T, d *testDaemon, l *client.Lease, id string, n int64) {
	t.Helper()
	req := apitype.StartRequest{ID: id, Lossless: true, Argv: []string{"sh", "-c", "head -c " + strconv.FormatInt(n, 10) + " /dev/urandom | tee out"}}
	if status, _, body := d.raw("POST", "/v1/leases/"+l.ID()+"/processes", l.Token(), jsonBody(req), nil); status != 201 && status != 200 {
		t.Fatalf("start: %d %s", status, body)
	}
}

// sumOf is the SHA-256 of a file in the lease's workdir, computed there.
func sumOf(t *testing.T, l *client.Lease, name string) string {
	t.Helper()
	res, err := l.Exec(context.Background(), apitype.ExecRequest{Argv: []string{"sha256sum", name}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("sha256sum %s: %+v %v", name, res, err)
	}
	return strings.Fields(res.Stdout)[0]
}

// A lossless viewer that reads slowly gets every byte, and holds the process back: it
// never gets further ahead than the buffers between them, and cannot end while more
// than that is unread. A lossy viewer beside it still works, and counts what it lost.
func TestLosslessAttachSlowReader(t *testing.T) {
	d := startDaemon(t, func(c *daemon.Config) { c.OutputBufferBytes = losslessBuffer })
	l := d.acquire("lossless-slow")
	ctx := context.Background()
	const total = 48 << 20
	bound := heldBound(t)
	randomOut(t, d, l, "gen", total)
	// This attach takes over the start's hold. (Not a
	// tiny TCP window: loopback segments that do not fit one are dropped and retransmitted
	// with backoff, which would make this reader slow for reasons of its own.)
	conn, _, resp := d.rawAttach(t, "/v1/leases/"+l.ID()+"/processes/gen/attach?since=0&lossless=1", false)
	defer conn.Close()
	if m := resp.Header.Get(apitype.HeaderOutputMode); m != apitype.OutputModeLossless {
		t.Fatalf("%s: %q", apitype.HeaderOutputMode, m)
	}
	start, _ := strconv.ParseInt(resp.Header.Get(apitype.HeaderOutputOffset), 10, 64)
	lost, _ := strconv.ParseInt(resp.Header.Get(apitype.HeaderBytesLost), 10, 64)

	lossy, err := l.Attach(ctx, "gen", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer lossy.Close()
	lossyDone := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, lossy.Stdout)
		lossyDone <- n
	}()

	if start != 0 || lost != 0 {
		t.Fatalf("lossless attach behind a lossless start: offset %d, %d bytes lost", start, lost)
	}
	h := sha256.New()
	var got int64
	var st apitype.Status
	checkpoint := int64(0)
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
	for {
		if got >= checkpoint {
			checkpoint += 4 << 20
			pr := must(l.Process(ctx, "gen"))(t)
			if ahead := pr.OutputOffset - got; ahead > bound {
				t.Fatalf("process %d bytes ahead of its lossless viewer (bound %d)", ahead, bound)
			}
			if got+bound < total && pr.State != apitype.ProcessRunning {
				t.Fatalf("process %s with %d of %d bytes unread by its lossless viewer", pr.State, total-got, total)
			}
			time.Sleep(50 * time.Millisecond) // a slow reader, not a wait for a state
		}
		_, msg, err := conn.ReadMessage()
		if err != nil {
			t.Fatalf("read after %d bytes: %v", got, err)
		}
		if msg[0] == apitype.ChannelStatus {
			if err := json.Unmarshal(msg[1:], &st); err != nil {
				t.Fatal(err)
			}
			break
		}
		if msg[0] == apitype.ChannelStdout {
			h.Write(msg[1:])
			got += int64(len(msg) - 1)
		}
	}
	if got != total || st.BytesLost != 0 || st.Status != apitype.StatusSuccess {
		t.Fatalf("lossless viewer: %d of %d bytes, status %+v", got, total, st)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != sumOf(t, l, "out") {
		t.Fatal("lossless viewer: the bytes differ from what the process wrote")
	}
	n := <-lossyDone
	if _, err := lossy.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if n+lossy.Lost() != total || lossy.Lossless() {
		t.Fatalf("lossy viewer beside it: %d delivered + %d lost != %d", n, lossy.Lost(), total)
	}
}

// A lossless viewer that goes away (a reset, no close frame) lets its process run on to
// its end; one that stalls is cut by the write timeout, which lets the process go too.
// The viewer's socket keeps its usual window: through a tiny one a single 128 KiB frame
// takes seconds to read (an ack round per few KiB), so the daemon would cut a viewer
// that is reading, not stalled. The write timeout leaves the check that the viewer
// holds the process seconds to run before a stalled one is cut.
func TestLosslessViewerGoneReleases(t *testing.T) {
	d := startFaultDaemon(t, func(c *daemon.Config) {
		c.OutputBufferBytes = losslessBuffer
		c.HTTP.WSWriteTimeout = 2 * time.Second
		c.HTTP.WSPingInterval = time.Hour
	})
	l := d.acquire("lossless-gone")
	ctx := context.Background()
	const total = 64 << 20
	for _, tc := range []struct {
		name  string
		reset bool
	}{{"reset", true}, {"stalled", false}} {
		t.Run(tc.name, func(t *testing.T) {
			randomOut(t, d, l, tc.name, total)
			conn, tcp, _ := d.rawAttach(t, "/v1/leases/"+l.ID()+"/processes/"+tc.name+"/attach?since=0&lossless=1", false)
			defer conn.Close()
			if _, _, err := conn.ReadMessage(); err != nil {
				t.Fatal(err)
			}
			if pr := must(l.Process(ctx, tc.name))(t); pr.State != apitype.ProcessRunning || pr.OutputOffset >= total {
				t.Fatalf("not held by a viewer that read one frame: %+v", pr)
			}
			if tc.reset {
				_ = tcp.SetLinger(0)
				_ = tcp.Close()
			}
			// Stalled: the daemon's write timeout ends the stream, then the hold.
			waitFor(t, "the process to end once its lossless viewer is gone", time.Minute, func() bool {
				return must(l.Process(ctx, tc.name))(t).State == apitype.ProcessExited
			})
			if pr := must(l.Process(ctx, tc.name))(t); pr.OutputOffset != total {
				t.Fatalf("after its viewer left: %+v", pr)
			}
			settleStreams(t, 0, "stream goroutines after the viewer left")
		})
	}
}

// The client's lossless modes: Start and ExecStream hold the output from its first
// byte, so a reader that starts late still gets it all; Attach with Lossless reports
// it; bad values of ?lossless are refused.
func TestLosslessClient(t *testing.T) {
	d := startDaemon(t, func(c *daemon.Config) { c.OutputBufferBytes = losslessBuffer })
	l := d.acquire("lossless-client")
	ctx := context.Background()
	const lines = 1_000_000 // 6.9 MB
	want := counted(lines)
	check := func(t *testing.T, p *client.Process) {
		t.Helper()
		defer p.Close()
		if !p.Lossless() {
			t.Fatal("Lossless() = false")
		}
		time.Sleep(200 * time.Millisecond) // start reading late, on purpose
		b, err := io.ReadAll(p.Stdout)
		if err != nil {
			t.Fatal(err)
		}
		st, err := p.Wait(ctx)
		if err != nil || st.ExitCode != 0 {
			t.Fatalf("%+v %v", st, err)
		}
		if string(b) != want || p.Lost() != 0 || st.BytesLost != 0 {
			t.Fatalf("%d of %d bytes, lost %d / %d", len(b), len(want), p.Lost(), st.BytesLost)
		}
	}
	argv := []string{"seq", "1", strconv.Itoa(lines)}
	t.Run("start", func(t *testing.T) {
		p, err := l.Start(ctx, apitype.StartRequest{Argv: argv, Lossless: true})
		if err != nil {
			t.Fatal(err)
		}
		check(t, p)
	})
	t.Run("exec-stream", func(t *testing.T) {
		p, err := l.ExecStream(ctx, client.ExecStreamRequest{Argv: argv, Lossless: true})
		if err != nil {
			t.Fatal(err)
		}
		check(t, p)
	})
	t.Run("attach", func(t *testing.T) {
		startUnwatched(t, l, apitype.StartRequest{ID: "sleeper", Argv: []string{"sleep", "60"}})
		p, err := l.AttachWith(ctx, "sleeper", client.AttachOptions{Since: -1, Lossless: true})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		if !p.Lossless() {
			t.Fatal("Lossless() = false")
		}
		q, err := l.Attach(ctx, "sleeper", -1)
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		if q.Lossless() {
			t.Fatal("a plain Attach is lossless")
		}
	})
	t.Run("bad-value", func(t *testing.T) {
		status, hdr, body := d.raw("GET", "/v1/leases/"+l.ID()+"/processes/sleeper/attach?lossless=maybe", testToken, nil, nil)
		wantProblem(t, status, hdr, body, 400, apitype.CodeInvalidRequest)
	})
}
