package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/process"
)

// The fuzz targets here drive the server's own code paths without a daemon: JSON
// request decoding with its error mapping, and the websocket stream (framing and
// control) of a real process over a real connection. Each input costs well under a
// millisecond or two, so the seed corpus runs in every go test and CI can fuzz briefly.

// FuzzDecodeJSON: any body, any Content-Type, into every request type the routes
// decode. The answer is success or a 400 invalid_request / 413 payload_too_large
// problem; never a panic, never a 5xx, never a hang on a body that does not end.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		``, `{}`, `null`, `[]`, `{"session_id":"s","ttl_seconds":60}`, `{"argv":["sh","-c","echo"],"env":{"A":"b"}}`,
		`{"argv":["x"]}{"argv":["y"]}`, `{"argv":["x"]} `, `{"unknown":1}`, `{"ttl_seconds":1e400}`,
		`{"ttl_seconds":-1}`, `{"signal":"KILL"}`, `{"source":"function transform(i){return i}","input":{}}`,
		`{"argv":"\ud800"}`, `{"env":{"":""}}`, "{\"argv\":[\"\x00\"]}", `{"limits":{"memory_bytes":18446744073709551616}}`,
		strings.Repeat(`[`, 20000), `{"a":` + strings.Repeat(`"x",`, 1000), "\xef\xbb\xbf{}",
	} {
		f.Add([]byte(s), "application/json")
	}
	f.Add([]byte(`{}`), "text/plain")
	f.Add([]byte(`{}`), "application/json; charset=utf-8")
	f.Add([]byte(`{}`), "")

	s := &Server{opts: ServerOptions{Limits: HTTPLimits{MaxJSONBytes: 4 << 10}}, log: slog.New(slog.DiscardHandler)}
	s.opts.Limits.setDefaults()
	targets := []func() any{
		func() any { return new(apitype.AcquireRequest) },
		func() any { return new(apitype.RenewRequest) },
		func() any { return new(apitype.ExecRequest) },
		func() any { return new(apitype.StartRequest) },
		func() any { return new(apitype.SignalRequest) },
		func() any { return new(scriptBody) },
	}
	f.Fuzz(func(t *testing.T, body []byte, contentType string) {
		for _, target := range targets {
			r := httptest.NewRequest(http.MethodPost, "/v1/leases", bytes.NewReader(body))
			if contentType != "" {
				r.Header.Set("Content-Type", contentType)
			}
			w := httptest.NewRecorder()
			v := target()
			err := s.decodeJSON(w, r, v)
			if err == nil {
				if _, merr := json.Marshal(v); merr != nil {
					t.Fatalf("decoded %T does not encode again: %v", v, merr)
				}
				continue
			}
			s.writeError(w, r, err)
			var p apitype.Problem
			if jerr := json.Unmarshal(w.Body.Bytes(), &p); jerr != nil {
				t.Fatalf("problem body for %q: %v", body, jerr)
			}
			switch {
			case w.Code == http.StatusBadRequest && p.Code == apitype.CodeInvalidRequest:
			case w.Code == http.StatusRequestEntityTooLarge && p.Code == apitype.CodePayloadTooLarge && len(body) > int(s.opts.Limits.MaxJSONBytes):
			default:
				t.Fatalf("%T from %q (Content-Type %q): %d %+v", v, body, contentType, w.Code, p)
			}
		}
	})
}

// FuzzStreamFrames writes arbitrary bytes, after a valid handshake, into a real
// websocket attachment to a running process: the framing of gorilla/websocket and the
// server's control handling (channels, resize, close) see every shape of input. The
// stream must end once the client goes away, never panic, and leave the process alone
// (a stdin close frame may end it: that is its contract).
func FuzzStreamFrames(f *testing.F) {
	mask := func(opcode byte, fin bool, payload []byte) []byte {
		b0 := opcode
		if fin {
			b0 |= 0x80
		}
		var hdr []byte
		switch n := len(payload); {
		case n < 126:
			hdr = []byte{b0, 0x80 | byte(n)}
		case n < 1<<16:
			hdr = []byte{b0, 0x80 | 126, byte(n >> 8), byte(n)}
		default:
			hdr = binary.BigEndian.AppendUint64([]byte{b0, 0x80 | 127}, uint64(n))
		}
		key := []byte{1, 2, 3, 4}
		out := append(hdr, key...)
		for i, c := range payload {
			out = append(out, c^key[i%4])
		}
		return out
	}
	bin := func(p ...byte) []byte { return mask(websocket.BinaryMessage, true, p) }
	cat := func(frames ...[]byte) []byte { return bytes.Join(frames, nil) }
	for _, seed := range [][]byte{
		bin(apitype.ChannelStdin, 'h', 'i', '\n'),
		bin(append([]byte{apitype.ChannelResize}, `{"Width":80,"Height":24}`...)...),
		bin(append([]byte{apitype.ChannelResize}, `{"Width":0,"Height":24}`...)...),
		bin(append([]byte{apitype.ChannelResize}, `{"Width":`...)...),
		bin(apitype.ChannelClose, apitype.ChannelStdout),
		bin(apitype.ChannelClose),
		bin(apitype.ChannelStdout, 'x'),
		bin(),
		mask(websocket.TextMessage, true, []byte("text")),
		mask(websocket.PingMessage, true, []byte("p")),
		mask(websocket.CloseMessage, true, websocket.FormatCloseMessage(websocket.CloseNormalClosure, "bye")),
		cat(mask(websocket.BinaryMessage, false, []byte{0, 'a'}), mask(0 /* continuation */, true, []byte("b\n"))),
		mask(0 /* continuation */, true, []byte("orphan")),
		{0x82, 0x05, 0, 'a', 'b', 'c', 'd'},                                      // unmasked: a protocol error from a client
		{0x82, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4}, // 2^63 bytes announced
		mask(websocket.BinaryMessage, true, make([]byte, 5<<10)),                 // over the read limit
		cat(bin(apitype.ChannelStdin, 'a'), bin(apitype.ChannelStdin, 'b'), bin(apitype.ChannelResize, '{', '}')),
		{0x8f, 0x80, 0, 0, 0, 0}, // reserved opcode
		{0xf2, 0x80, 0, 0, 0, 0}, // reserved bits
	} {
		f.Add(seed, true)
	}
	// v5 closes cat's stdin, then v4 must find a cat it cannot end: the harness waits
	// out the first cat before the second run.
	f.Add(bin(apitype.ChannelClose, apitype.ChannelStdin), true)
	f.Add(bin(apitype.ChannelClose, apitype.ChannelStdin), false) // v4 has no close channel

	h := newStreamHarness(f)
	f.Fuzz(func(t *testing.T, frames []byte, v5 bool) {
		proto := apitype.StreamProtocolV4
		if v5 {
			proto = apitype.StreamProtocolV5
		}
		h.run(t, proto, frames)
	})
}

// streamHarness serves attachments of one long-running `cat` (restarted when a close
// frame ends its stdin) on a plain-HTTP loopback listener.
type streamHarness struct {
	srv   *Server
	procs *process.Manager
	http  *httptest.Server

	mu      sync.Mutex
	p       *process.Process
	done    chan error // one per request: the handler's outcome
	started int
}

func newStreamHarness(tb testing.TB) *streamHarness {
	procs, err := process.New(process.Config{Execer: plainExecer{}, BufferBytes: process.MinBufferBytes})
	if err != nil {
		tb.Fatal(err)
	}
	h := &streamHarness{
		srv:   &Server{opts: ServerOptions{Limits: HTTPLimits{WSReadLimit: 4 << 10}}, log: slog.New(slog.DiscardHandler)},
		procs: procs,
		done:  make(chan error, 1),
	}
	h.srv.opts.Limits.setDefaults()
	h.http = httptest.NewServer(http.HandlerFunc(h.serve))
	tb.Cleanup(func() {
		h.http.Close()
		procs.ReleaseLease("fuzz")
	})
	return h
}

func (h *streamHarness) process() (*process.Process, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.p != nil {
		// A v5 run may have closed cat's stdin: cat then ends on its own, a moment
		// later. Wait that out, so that every run starts on a cat that can still read
		// and the v4 check in run sees only what its own frames did.
		if _, err := h.p.WriteStdin(nil); errors.Is(err, process.ErrStdinClosed) {
			select {
			case <-h.p.Done():
			case <-time.After(10 * time.Second):
				return nil, errors.New("cat did not end after its stdin was closed")
			}
		}
		select {
		case <-h.p.Done():
		default:
			return h.p, nil
		}
	}
	h.started++
	p, _, err := h.procs.Start(context.Background(), "fuzz", process.StartRequest{
		ID: fmt.Sprintf("cat-%d", h.started), Spec: process.Spec{Argv: []string{"cat"}}, Stdin: true,
	})
	h.p = p
	return p, err
}

func (h *streamHarness) serve(w http.ResponseWriter, r *http.Request) {
	var err error
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("stream panicked: %v", v)
		}
		h.done <- err
	}()
	proto, err := streamProtocol(r)
	if err != nil {
		return
	}
	p, err := h.process()
	if err != nil {
		return
	}
	sub, err := p.Subscribe(-1)
	if err != nil {
		return
	}
	err = h.srv.stream(w, r, proto, nil, p, sub, false) // it closes sub
}

// run does one handshake, writes frames, closes, and waits for the handler to end.
func (h *streamHarness) run(t *testing.T, proto string, frames []byte) {
	conn, err := net.Dial("tcp", h.http.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /attach HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: %s\r\n\r\n", proto)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %s", resp.Status)
	}
	_, _ = conn.Write(frames) // the server may already have closed on a bad frame
	_ = conn.(*net.TCPConn).CloseWrite()
	// Drain what the server says (a close frame, maybe) until it hangs up.
	_, _ = io.Copy(io.Discard, conn)
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end after the client went away")
	}
	h.mu.Lock()
	p := h.p
	h.mu.Unlock()
	// Only v5 can close stdin (channel 255), which ends cat; under v4 nothing a client
	// sends may end the process.
	if st := p.Status(); proto == apitype.StreamProtocolV4 && st.State != apitype.ProcessRunning {
		t.Fatalf("the process ended under a v4 stream, which cannot close its stdin: %+v", st)
	}
}

// plainExecer runs fuzz processes as the test's user in their own process group: no
// sandbox is needed to exercise the stream code.
type plainExecer struct{}

func (plainExecer) Command(_ string, spec process.Spec) (*exec.Cmd, process.Tree, error) {
	if len(spec.Argv) == 0 {
		return nil, nil, errors.New("empty argv")
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, pgroupTree{cmd}, nil
}

type pgroupTree struct{ cmd *exec.Cmd }

func (t pgroupTree) Signal(sig syscall.Signal) error {
	if t.cmd.Process == nil {
		return errors.New("not started")
	}
	return syscall.Kill(-t.cmd.Process.Pid, sig)
}
func (t pgroupTree) Start() error    { return t.cmd.Start() }
func (t pgroupTree) Kill() error     { return t.Signal(syscall.SIGKILL) }
func (t pgroupTree) OOMKilled() bool { return false }
func (t pgroupTree) Close() error    { _ = t.Kill(); return nil }
