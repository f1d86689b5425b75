package daemon_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// wsDial opens a raw websocket to path with the given subprotocols.
func (d *testDaemon) wsDial(path, token string, protocols ...string) (*websocket.Conn, *http.Response, error) {
	pem, err := os.ReadFile(d.caFile)
	if err != nil {
		d.t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	dialer := websocket.Dialer{
		TLSClientConfig:  &tls.Config{RootCAs: pool},
		Subprotocols:     protocols,
		HandshakeTimeout: 10 * time.Second,
	}
	h := http.Header{}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return dialer.Dial("wss://"+strings.TrimPrefix(d.url, "https://")+path, h)
}

// readOutput reads frames until want bytes of output arrived or the status came.
func readOutput(t *testing.T, c *websocket.Conn, want int) (out []byte, status *apitype.Status) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for want < 0 || len(out) < want {
		_, msg, err := c.ReadMessage()
		if err != nil {
			return out, status
		}
		if len(msg) == 0 {
			t.Fatal("empty frame")
		}
		switch msg[0] {
		case apitype.ChannelStdout, apitype.ChannelStderr:
			out = append(out, msg[1:]...)
		case apitype.ChannelStatus:
			var st apitype.Status
			if err := json.Unmarshal(msg[1:], &st); err != nil {
				t.Fatalf("status frame: %v", err)
			}
			status = &st
		}
	}
	return out, status
}

func counted(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.String()
}

// A dropped attachment resumes exactly: since=N gives the missing bytes, in order, no dupes.
func TestAttachResumesExactly(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("resume")
	status, _, body := d.raw("POST", "/v1/leases/"+l.ID()+"/processes", testToken,
		jsonBody(apitype.StartRequest{ID: "counter", Argv: []string{"seq", "1", "20000"}}), nil)
	if status != http.StatusCreated {
		t.Fatalf("start: %d %s", status, body)
	}
	// Same client id: the same process, not a second one.
	status, _, body2 := d.raw("POST", "/v1/leases/"+l.ID()+"/processes", testToken,
		jsonBody(apitype.StartRequest{ID: "counter", Argv: []string{"seq", "1", "20000"}}), nil)
	if status != http.StatusOK || !bytes.Contains(body2, []byte(`"pid":"counter"`)) {
		t.Fatalf("idempotent start: %d %s", status, body2)
	}

	path := "/v1/leases/" + l.ID() + "/processes/counter/attach"
	var got []byte
	for _, cut := range []int{1, 4096, 50000} {
		c, resp, err := d.wsDial(path+"?since="+strconv.Itoa(len(got)), testToken, apitype.StreamProtocolV5)
		if err != nil {
			t.Fatalf("attach: %v", err)
		}
		if off := resp.Header.Get(apitype.HeaderOutputOffset); off != strconv.Itoa(len(got)) {
			t.Fatalf("X-Output-Offset %s, want %d", off, len(got))
		}
		part, _ := readOutput(t, c, cut)
		c.Close() // the client "loses" its connection mid-stream
		got = append(got, part...)
	}
	c, _, err := d.wsDial(path+"?since="+strconv.Itoa(len(got)), testToken, apitype.StreamProtocolV5)
	if err != nil {
		t.Fatal(err)
	}
	rest, st := readOutput(t, c, -1)
	c.Close()
	got = append(got, rest...)
	if string(got) != counted(20000) {
		t.Fatalf("resumed output differs: %d bytes, want %d", len(got), len(counted(20000)))
	}
	if st == nil || st.Status != apitype.StatusSuccess || st.ExitCode != 0 {
		t.Fatalf("status: %+v", st)
	}
}

// The client handle: start, read to the end, wait; exit codes come back exactly.
func TestClientStartAndWait(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("handle")
	ctx := context.Background()
	p := must(l.Start(ctx, apitype.StartRequest{Argv: []string{"/bin/sh", "-c", "seq 1 1000; echo oops >&2; exit 3"}}))(t)
	var out, errOut bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&errOut, p.Stderr); close(done) }()
	io.Copy(&out, p.Stdout)
	<-done
	st := must(p.Wait(ctx))(t)
	if out.String() != counted(1000) || errOut.String() != "oops\n" {
		t.Fatalf("output: %d bytes stdout, stderr %q", out.Len(), errOut.String())
	}
	if st.ExitCode != 3 || st.Status != apitype.StatusFailure || st.Reason != apitype.ReasonNonZeroExitCode {
		t.Fatalf("status: %+v", st)
	}
	procs := must(l.Processes(ctx))(t)
	if len(procs) != 1 || procs[0].State != apitype.ProcessExited || procs[0].ExitCode == nil || *procs[0].ExitCode != 3 {
		t.Fatalf("process list: %+v", procs)
	}
}

func TestPTY(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("pty")
	ctx := context.Background()

	// stty size follows a resize.
	p := must(l.ExecStream(ctx, client.ExecStreamRequest{
		Argv: []string{"/bin/sh", "-c", `stty size; read x; stty size`}, TTY: true, Stdin: true, Rows: 24, Cols: 80,
	}))(t)
	var buf bytes.Buffer
	readUntil := func(want string) {
		t.Helper()
		chunk := make([]byte, 4096)
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(buf.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %q, got %q", want, buf.String())
			}
			n, err := p.Stdout.Read(chunk)
			buf.Write(chunk[:n])
			if err != nil {
				break
			}
		}
	}
	readUntil("24 80")
	if err := p.Resize(50, 132); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	readUntil("50 132")
	// Wait returns once the output is read: the terminal's last "\r\n" may come in a
	// frame of its own after the one readUntil stopped at.
	if _, err := io.Copy(io.Discard, p.Stdout); err != nil {
		t.Fatal(err)
	}
	st := must(p.Wait(ctx))(t)
	if st.ExitCode != 0 {
		t.Fatalf("status %+v", st)
	}

	// Closing stdin (255 0) ends cat.
	p = must(l.ExecStream(ctx, client.ExecStreamRequest{Argv: []string{"cat"}, Stdin: true}))(t)
	go io.Copy(io.Discard, p.Stderr)
	if _, err := p.Stdin.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.Stdin.Close(); err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(p.Stdout)
	if string(out) != "hello\n" {
		t.Fatalf("cat output %q", out)
	}
	if st := must(p.Wait(ctx))(t); st.ExitCode != 0 {
		t.Fatalf("cat status %+v", st)
	}

	// A signal comes back exactly.
	p = must(l.ExecStream(ctx, client.ExecStreamRequest{Argv: []string{"sleep", "100"}, Detach: true}))(t)
	if err := p.Signal(ctx, "TERM"); err != nil {
		t.Fatal(err)
	}
	st = must(p.Wait(ctx))(t)
	if st.Signal != "TERM" || st.ExitCode != 128+15 || st.Status != apitype.StatusFailure {
		t.Fatalf("signal status %+v", st)
	}
}

// A streaming exec takes the environment and both timeouts a buffered exec does.
func TestExecStreamEnvAndTimeouts(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("stream-env")
	ctx := context.Background()

	p := must(l.ExecStream(ctx, client.ExecStreamRequest{
		Argv: []string{"/bin/sh", "-c", `printf '%s' "$GREETING"`}, Env: map[string]string{"GREETING": "hi there"},
	}))(t)
	go io.Copy(io.Discard, p.Stderr)
	out, _ := io.ReadAll(p.Stdout)
	if st := must(p.Wait(ctx))(t); string(out) != "hi there" || st.ExitCode != 0 {
		t.Fatalf("env: output %q, status %+v", out, st)
	}

	for _, req := range []client.ExecStreamRequest{
		{Argv: []string{"sleep", "100"}, TimeoutSeconds: 0.5},
		{Argv: []string{"sleep", "100"}, IdleTimeoutSeconds: 0.5},
	} {
		p := must(l.ExecStream(ctx, req))(t)
		go io.Copy(io.Discard, p.Stdout)
		go io.Copy(io.Discard, p.Stderr)
		if st := must(p.Wait(ctx))(t); !st.TimedOut {
			t.Fatalf("%+v: status %+v, want timed out", req, st)
		}
	}
}

func TestStreamBadInput(t *testing.T) {
	d := startDaemon(t)
	a := d.acquire("ws-a")
	b := d.acquire("ws-b")
	ctx := context.Background()
	p := must(a.Start(ctx, apitype.StartRequest{ID: "sleeper", Argv: []string{"sleep", "300"}, Stdin: true}))(t)
	defer p.Close()
	attach := "/v1/leases/" + a.ID() + "/processes/sleeper/attach"

	t.Run("wrong subprotocol", func(t *testing.T) {
		_, resp, err := d.wsDial(attach, testToken, "chat")
		if err == nil || resp == nil || resp.StatusCode != 400 {
			t.Fatalf("upgrade with a wrong subprotocol: %v %v", err, resp)
		}
	})
	t.Run("no subprotocol on exec starts nothing", func(t *testing.T) {
		before := len(must(a.Processes(ctx))(t))
		_, resp, err := d.wsDial("/v1/leases/"+a.ID()+"/exec?command=sleep&command=99", testToken)
		if err == nil || resp == nil || resp.StatusCode != 400 {
			t.Fatalf("exec upgrade without subprotocol: %v %v", err, resp)
		}
		if after := len(must(a.Processes(ctx))(t)); after != before {
			t.Fatalf("a refused exec started a process: %d → %d", before, after)
		}
	})
	t.Run("another lease's token", func(t *testing.T) {
		_, resp, err := d.wsDial(attach, b.Token(), apitype.StreamProtocolV5)
		if err == nil || resp == nil || resp.StatusCode != 403 {
			t.Fatalf("attach with another lease's token: %v %v", err, resp)
		}
	})
	t.Run("unknown process", func(t *testing.T) {
		_, resp, err := d.wsDial("/v1/leases/"+a.ID()+"/processes/nope/attach", testToken, apitype.StreamProtocolV5)
		if err == nil || resp == nil || resp.StatusCode != 404 {
			t.Fatalf("attach to an unknown process: %v %v", err, resp)
		}
	})
	for name, frame := range map[string][]byte{
		"garbage channel":  {42, 1, 2, 3},
		"empty message":    {},
		"absurd resize":    append([]byte{apitype.ChannelResize}, []byte(`{"Width":60000,"Height":1}`)...),
		"malformed resize": append([]byte{apitype.ChannelResize}, []byte(`{{{`)...),
		"huge message":     append([]byte{apitype.ChannelStdin}, make([]byte, 64<<20)...),
	} {
		t.Run(name, func(t *testing.T) {
			c, _, err := d.wsDial(attach+"?since=-1", testToken, apitype.StreamProtocolV5)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.WriteMessage(websocket.BinaryMessage, frame)
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			var ce *websocket.CloseError
			for {
				_, _, err = c.ReadMessage()
				if err != nil {
					break
				}
			}
			if !errors.As(err, &ce) || ce.Code == websocket.CloseNormalClosure {
				t.Fatalf("want a protocol close code, got %v", err)
			}
		})
	}
	t.Run("bad signal name", func(t *testing.T) {
		status, hdr, body := d.raw("POST", "/v1/leases/"+a.ID()+"/processes/sleeper/signal", testToken, strings.NewReader(`{"signal":"NOPE"}`), nil)
		wantProblem(t, status, hdr, body, 400, apitype.CodeInvalidRequest)
	})
	// The daemon is unharmed: the process still runs and the lease still serves.
	pr := must(a.Process(ctx, "sleeper"))(t)
	if pr.State != apitype.ProcessRunning {
		t.Fatalf("process after hostile frames: %+v", pr)
	}
	if r := must(a.Exec(ctx, sh("echo fine")))(t); r.Stdout != "fine\n" {
		t.Fatalf("exec after hostile frames: %+v", r)
	}
}

// Processes that died with the daemon are reported lost, never as exit 0.
func TestProcessLostAcrossRestart(t *testing.T) {
	d := startDaemon(t)
	l := d.acquireOnce(apitype.AcquireRequest{SessionID: "lost"})
	ctx := context.Background()
	status, _, body := d.raw("POST", "/v1/leases/"+l.ID()+"/processes", testToken, jsonBody(apitype.StartRequest{ID: "server", Argv: []string{"sleep", "301.731"}}), nil)
	if status != http.StatusCreated {
		t.Fatalf("start: %d %s", status, body)
	}
	d.restart()
	pr := must(d.client.OpenLease(l.ID(), l.Token()).Process(ctx, "server"))(t)
	if pr.State != apitype.ProcessLost || pr.ExitCode != nil {
		t.Fatalf("after restart: %+v", pr)
	}
	for _, line := range psLines(t) {
		if strings.Contains(line, "sleep 301.731") {
			// Only this test starts "sleep 301.731" (a marker no other test uses); it must be gone.
			t.Fatalf("a process of the previous daemon is still running unsupervised: %s", line)
		}
	}
}
