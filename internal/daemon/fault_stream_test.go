package daemon_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
)

// Clients that go away badly: a TCP reset in the middle of a stream, a client that
// stops reading, a slow reader against a fast writer. The daemon must free what the
// stream held, keep the process running (or kill it, for a non-detached exec stream),
// and let a client resume at its offset.

// rawAttach dials a websocket and returns the TCP connection under TLS too, so a test
// can reset it (SetLinger(0) + Close: an RST, no close frame, no FIN).
// With smallWindow, the socket's receive buffer is tiny, so that a client that stops
// reading stalls the daemon's writes at once.
func (d *testDaemon) rawAttach(t *testing.T, path string, smallWindow bool) (*websocket.Conn, *net.TCPConn, *http.Response) {
	t.Helper()
	pem, err := os.ReadFile(d.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	var tcp *net.TCPConn
	dialer := websocket.Dialer{
		TLSClientConfig:  &tls.Config{RootCAs: pool},
		Subprotocols:     []string{apitype.StreamProtocolV5},
		HandshakeTimeout: 10 * time.Second,
		ReadBufferSize:   4 << 10,
		NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err == nil {
				tcp = c.(*net.TCPConn)
				if smallWindow {
					_ = tcp.SetReadBuffer(4 << 10)
				}
			}
			return c, err
		},
	}
	conn, resp, err := dialer.Dial("wss://"+strings.TrimPrefix(d.url, "https://")+path, http.Header{"Authorization": {"Bearer " + testToken}})
	if err != nil {
		t.Fatalf("dial %s: %v (%v)", path, err, resp)
	}
	return conn, tcp, resp
}

// settleStreams waits (bounded) until the goroutines serving websocket streams in this
// process (handler, writer, pump) are back to at most base. Counting only these keeps
// the check about the stream: the test process also runs clients, renew loops and
// other daemons whose goroutines come and go.
func settleStreams(t *testing.T, base int, what string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for streamGoroutines() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("%s: %d stream goroutines, %d before:\n%s", what, streamGoroutines(), base, buf[:n])
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
}

// startUnwatched starts a background process and closes the attachment that Start
// opens, so that the only streams the daemon serves afterwards are the test's own.
func startUnwatched(t *testing.T, l *client.Lease, req apitype.StartRequest) {
	t.Helper()
	p, err := l.Start(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Close()
	settleStreams(t, 0, "stream goroutines after the start handle closed")
}

// streamGoroutines counts the goroutines running the daemon's stream code.
func streamGoroutines() int {
	buf := make([]byte, 4<<20)
	n := runtime.Stack(buf, true)
	count := 0
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		if strings.Contains(g, "sidecar.(*Server).stream") {
			count++
		}
	}
	return count
}

func TestFaultClientResetMidStream(t *testing.T) {
	d := startFaultDaemon(t)
	l := d.acquire("reset")
	ctx := context.Background()
	const lines = 100000 // 589 KB of output: less than the 1 MiB replay buffer
	// The process waits for a file before it ends, so it is still running when the
	// client resets.
	startUnwatched(t, l, apitype.StartRequest{ID: "counter", Argv: []string{"sh", "-c", "seq 1 " + strconv.Itoa(lines) + "; while [ ! -e go ]; do sleep 0.05; done"}})
	base := streamGoroutines()
	path := "/v1/leases/" + l.ID() + "/processes/counter/attach"
	conn, tcp, _ := d.rawAttach(t, path+"?since=0", false)
	got, _ := readOutput(t, conn, 1000)
	if streamGoroutines() <= base {
		t.Fatal("no stream goroutine is running during the attach")
	}
	_ = tcp.SetLinger(0)
	_ = tcp.Close() // RST: no close frame, no FIN
	start := time.Now()
	settleStreams(t, base, "stream goroutines after a reset stream")
	t.Logf("stream goroutines gone %v after the reset", time.Since(start).Round(time.Millisecond))

	pr := must(l.Process(ctx, "counter"))(t)
	if pr.State != apitype.ProcessRunning {
		t.Fatalf("an attach reset by its client ended the process: %+v", pr)
	}
	// Resume at exactly the offset received.
	conn2, _, resp := d.rawAttach(t, path+"?since="+strconv.Itoa(len(got)), false)
	if off := resp.Header.Get(apitype.HeaderOutputOffset); off != strconv.Itoa(len(got)) {
		t.Fatalf("X-Output-Offset %s, want %d", off, len(got))
	}
	if err := l.WriteFile(ctx, "go", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rest, st := readOutput(t, conn2, -1)
	conn2.Close()
	if string(got)+string(rest) != counted(lines) {
		t.Fatalf("resumed output differs: %d+%d bytes, want %d", len(got), len(rest), len(counted(lines)))
	}
	if st == nil || st.Status != apitype.StatusSuccess || st.BytesLost != 0 {
		t.Fatalf("status after resume: %+v", st)
	}
}

// A non-detached exec stream whose client vanishes takes its process tree with it.
func TestFaultExecStreamResetKillsProcess(t *testing.T) {
	d := startFaultDaemon(t)
	l := d.acquire("reset-exec")
	marker := "sidecar-fault-exec-reset-" + strconv.Itoa(os.Getpid())
	base := streamGoroutines()
	q := url.Values{"command": {"sh", "-c", "echo up; while :; do sleep 1; done", marker}}
	conn, tcp, resp := d.rawAttach(t, "/v1/leases/"+l.ID()+"/exec?"+q.Encode(), false)
	pid := resp.Header.Get(apitype.HeaderProcessID)
	if out, _ := readOutput(t, conn, 3); string(out) != "up\n" {
		t.Fatalf("exec stream said %q", out)
	}
	if len(markedProcs(marker)) == 0 {
		t.Fatal("the marked process is not visible in /proc")
	}
	_ = tcp.SetLinger(0)
	_ = tcp.Close()
	waitFor(t, "the exec stream's process tree to die", 15*time.Second, func() bool { return len(markedProcs(marker)) == 0 })
	settleStreams(t, base, "stream goroutines after a reset exec stream")
	var pr apitype.Process
	waitFor(t, "the daemon to see the process end", 15*time.Second, func() bool {
		pr = must(l.Process(context.Background(), pid))(t)
		return pr.State != apitype.ProcessRunning
	})
	if pr.State == apitype.ProcessRunning || (pr.ExitCode != nil && *pr.ExitCode == 0 && pr.Signal == "") {
		t.Fatalf("process of a reset exec stream: %+v", pr)
	}
}

// A client that stops reading is cut at the write timeout; the process never waits for
// it, and the daemon's memory does not grow with what the client did not read.
func TestFaultClientStopsReading(t *testing.T) {
	d := startFaultDaemon(t, func(c *daemon.Config) { c.HTTP.WSWriteTimeout = time.Second })
	l := d.acquire("stalled")
	ctx := context.Background()
	const total = 64 << 20
	startUnwatched(t, l, apitype.StartRequest{ID: "firehose", Argv: []string{"head", "-c", strconv.Itoa(total), "/dev/zero"}})
	base := streamGoroutines()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	conn, _, _ := d.rawAttach(t, "/v1/leases/"+l.ID()+"/processes/firehose/attach?since=0", true)
	defer conn.Close()
	// Never read: the process must still run to its end.
	waitFor(t, "the process to finish while its only viewer reads nothing", 60*time.Second, func() bool {
		return must(l.Process(ctx, "firehose"))(t).State == apitype.ProcessExited
	})
	pr := must(l.Process(ctx, "firehose"))(t)
	if pr.OutputOffset != total || pr.ExitCode == nil || *pr.ExitCode != 0 {
		t.Fatalf("process behind a stalled viewer: %+v", pr)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 32<<20 {
		t.Fatalf("heap grew by %d MiB behind a client that read nothing of %d MiB", grew>>20, total>>20)
	}
	// The daemon cut the stalled client at its write timeout: its goroutines are gone
	// even though the client never closed.
	settleStreams(t, base, "stream goroutines after a stalled client was cut")
}

// A client that stops reading is cut once a write has been blocked for WSWriteTimeout,
// whatever the reader's own deadline (two pings plus the write timeout): here pings are
// an hour apart, so only the cut can end the stream. The process keeps running.
func TestFaultStalledReaderCut(t *testing.T) {
	d := startFaultDaemon(t, func(c *daemon.Config) {
		c.HTTP.WSWriteTimeout = time.Second
		c.HTTP.WSPingInterval = time.Hour
	})
	l := d.acquire("stalled-reader")
	ctx := context.Background()
	// A steady trickle (about 10 MB/s) that never ends: something is always to be written.
	startUnwatched(t, l, apitype.StartRequest{ID: "trickle", Argv: []string{"sh", "-c", "while :; do head -c 1048576 /dev/zero; sleep 0.1; done"}})
	conn, _, _ := d.rawAttach(t, "/v1/leases/"+l.ID()+"/processes/trickle/attach?since=-1", true)
	defer conn.Close()
	if streamGoroutines() == 0 {
		t.Fatal("no stream handler is running after the attach")
	}
	// Read nothing: the daemon must end the stream (its handler returns) well before the
	// reader's own deadline of two hours. (What the client reads afterwards depends on
	// the kernel's handling of the orphaned socket, so it is not asserted.)
	waitFor(t, "the daemon to end the stream of a client that reads nothing", time.Minute, func() bool {
		return streamGoroutines() == 0
	})
	if pr := must(l.Process(ctx, "trickle"))(t); pr.State != apitype.ProcessRunning {
		t.Fatalf("the process behind a cut viewer: %+v", pr)
	}
}

// A slow reader against a fast writer: it gets what it can, the rest is counted in
// bytes_lost, and delivered + lost is exactly what the process wrote.
func TestFaultSlowReader(t *testing.T) {
	d := startFaultDaemon(t, func(c *daemon.Config) { c.HTTP.WSWriteTimeout = 20 * time.Second })
	l := d.acquire("slow")
	ctx := context.Background()
	const total = 32 << 20
	startUnwatched(t, l, apitype.StartRequest{ID: "fast", Argv: []string{"head", "-c", strconv.Itoa(total), "/dev/urandom"}})
	conn, _, resp := d.rawAttach(t, "/v1/leases/"+l.ID()+"/processes/fast/attach?since=0", false)
	defer conn.Close()
	headerLost, _ := strconv.ParseInt(resp.Header.Get(apitype.HeaderBytesLost), 10, 64)
	var got int64
	var st apitype.Status
	exitedWhileReading := false
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
	for frames := 0; ; frames++ {
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
		got += int64(len(msg) - 1)
		if frames == 0 {
			// Dawdle on the first frame until the process is done (well within the
			// write timeout): a reader this slow must not hold it back.
			start := time.Now()
			for time.Since(start) < 15*time.Second && must(l.Process(ctx, "fast"))(t).State != apitype.ProcessExited {
				time.Sleep(10 * time.Millisecond) // poll interval
			}
			pr := must(l.Process(ctx, "fast"))(t)
			exitedWhileReading = pr.State == apitype.ProcessExited
			if !exitedWhileReading {
				t.Errorf("BUG: a viewer that does not read holds its process back: after %v, %d of %d bytes written, state %s",
					time.Since(start).Round(time.Millisecond), pr.OutputOffset, total, pr.State)
			}
		}
	}
	if st.Status != apitype.StatusSuccess {
		t.Fatalf("status %+v", st)
	}
	// The status counts every byte this attachment missed, those already gone when it
	// attached (X-Output-Bytes-Lost) included (docs/api.md).
	if st.BytesLost == 0 || st.BytesLost < headerLost || got+st.BytesLost != total {
		t.Fatalf("delivered %d + lost %d (of which %d at attach) != %d written", got, st.BytesLost, headerLost, total)
	}
	t.Logf("slow reader: delivered %d, lost %d of %d", got, st.BytesLost, total)
}
