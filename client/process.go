package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

const (
	streamProtocolV5 = apitype.StreamProtocolV5
	streamProtocolV4 = apitype.StreamProtocolV4
)

var (
	// ErrHandleClosed: Close was called on the process handle before the process ended.
	ErrHandleClosed = errors.New("client: process handle closed")
	// ErrConnectionLost: the stream broke and could not be (or must not be) reattached.
	ErrConnectionLost = errors.New("client: process stream lost")
	// ErrStdinClosed: a write after Stdin.Close, or stdin closing on a v4 stream.
	ErrStdinClosed = errors.New("client: stdin closed")
)

// Stream limits and timings.
const (
	maxStdinFrame = 32 << 10 // stdin is sent in frames of at most this payload
	maxStatusSize = 64 << 10 // the one status frame
	pingEvery     = 30 * time.Second
	readTimeout   = 75 * time.Second // no frame nor pong for this long: the connection is dead
	writeTimeout  = 30 * time.Second
)

// Process is a handle on a process attached over a websocket. Read Stdout and Stderr
// concurrently and to EOF (as with os/exec pipes): output is delivered with backpressure,
// so an unread stream stalls the other and the status. A TTY process writes to Stdout only.
//
// A lossy handle (the default) never slows the process: when the reader falls behind the
// daemon's replay buffer, the bytes it missed are counted by Lost. A lossless handle
// (AttachOptions.Lossless, StartRequest.Lossless, ExecStreamRequest.Lossless) makes the
// daemon hold the process instead: it blocks in write until this reader has taken its
// output, for every viewer; Lost then counts only what was gone before it attached or
// while it was reconnecting.
//
// When the connection drops, the handle reattaches by itself (bounded retries with
// backoff) at the offset it had reached, so output has no gap and no duplicate; bytes the
// daemon's replay buffer no longer held are counted by Lost. Stdin bytes written while the
// connection is down are sent once it is back.
type Process struct {
	Stdin  io.WriteCloser
	Stdout io.Reader
	Stderr io.Reader

	lease    *Lease
	id       string
	tty      bool
	reattach bool // false: the process ended with the connection (a non-detached exec stream)
	lossless bool // ask the daemon to hold the process for this handle (?lossless=1)

	ctx    context.Context // ends with Close or the end of the process
	cancel context.CancelFunc

	offset atomic.Int64 // next output byte no Read has returned yet (outPipe counts them)
	lost   atomic.Int64

	mu          sync.Mutex
	conn        *websocket.Conn
	proto       string
	connChanged chan struct{} // closed and replaced at every reattach
	stdinClosed bool

	wmu sync.Mutex // gorilla allows one writer at a time

	outW, errW *outPipe
	done       chan struct{}
	once       sync.Once
	status     apitype.Status
	err        error
}

// attachment is one websocket connection of a Process.
type attachment struct {
	conn   *websocket.Conn
	start  int64 // X-Output-Offset: offset of the first byte it delivers
	lost   int64 // X-Output-Bytes-Lost
	procID string
}

// Attach watches process pid from output offset since (0: everything still buffered),
// lossy: see Process.
func (l *Lease) Attach(ctx context.Context, pid string, since int64) (*Process, error) {
	return l.attach(ctx, pid, AttachOptions{Since: since}, false)
}

// AttachOptions says how AttachWith watches a process.
type AttachOptions struct {
	// Since is the output offset to start from: 0 for everything still buffered, -1 for
	// live output only.
	Since int64
	// Lossless makes the daemon slow the process down to this reader rather than drop
	// bytes it has not read (see Process). A daemon without lossless attach is refused
	// with an error wrapping errors.ErrUnsupported.
	Lossless bool
}

// AttachWith watches process pid as o says.
func (l *Lease) AttachWith(ctx context.Context, pid string, o AttachOptions) (*Process, error) {
	return l.attach(ctx, pid, o, false)
}

// attach starts the handle's reader only once everything it reads (tty) is set.
func (l *Lease) attach(ctx context.Context, pid string, o AttachOptions, tty bool) (*Process, error) {
	since := o.Since
	p := newProcess(l, pid, tty, true)
	p.lossless = o.Lossless
	a, err := p.dialRetry(ctx, since, l.c.retry)
	if err != nil {
		p.cancel()
		return nil, err
	}
	p.begin(a, since)
	return p, nil
}

// Start starts a background process and attaches to it from offset 0, losslessly with
// req.Lossless (the daemon holds the output from its first byte for this attach). Only a
// request with a client-chosen ID is retried: the daemon returns the same process for
// the same ID.
func (l *Lease) Start(ctx context.Context, req apitype.StartRequest) (*Process, error) {
	var proc apitype.Process
	err := l.c.doJSON(ctx, request{method: http.MethodPost, path: leasePath(l.id, "processes"), json: req,
		lease: l, idempotent: req.ID != ""}, &proc)
	if err != nil {
		return nil, err
	}
	p, err := l.attach(ctx, proc.PID, AttachOptions{Lossless: req.Lossless}, req.TTY)
	if err != nil {
		return nil, fmt.Errorf("client: process %s started but attach failed: %w", proc.PID, err)
	}
	return p, nil
}

// ExecStreamRequest starts a process over the GET …/exec websocket in one round trip.
type ExecStreamRequest struct {
	Argv       []string
	Env        map[string]string
	Cwd        string
	TTY        bool
	Stdin      bool
	Rows, Cols uint16
	// Detach keeps the process running when the connection closes; the handle then
	// reattaches after a drop like one from Start.
	Detach bool
	// TimeoutSeconds kills the process after that long; IdleTimeoutSeconds after that
	// long without output. Zero: no limit but the lease's.
	TimeoutSeconds     float64
	IdleTimeoutSeconds float64
	// KillLeftovers kills what the process leaves behind once it exits; otherwise that
	// stays in the lease (Lease.Leftovers) until the lease ends.
	KillLeftovers bool
	// Lossless: the process waits for this reader rather than drop output (see Process),
	// from its first byte.
	Lossless bool
}

// ExecStream starts argv and attaches to it at once (what `sidecar shell` uses). Unless
// Detach is set the daemon kills the process when the connection closes, so a dropped
// connection ends Wait with ErrConnectionLost rather than reattaching.
func (l *Lease) ExecStream(ctx context.Context, req ExecStreamRequest) (*Process, error) {
	if len(req.Argv) == 0 {
		return nil, fmt.Errorf("%w: empty argv", ErrInvalidRequest)
	}
	q := url.Values{"command": req.Argv}
	flag := func(name string, on bool) {
		if on {
			q.Set(name, "1")
		}
	}
	flag("tty", req.TTY)
	flag("stdin", req.Stdin)
	flag("detach", req.Detach)
	flag("kill_leftovers", req.KillLeftovers)
	flag("lossless", req.Lossless)
	if req.Cwd != "" {
		q.Set("cwd", req.Cwd)
	}
	for k, v := range req.Env {
		if k == "" || strings.Contains(k, "=") {
			return nil, fmt.Errorf("%w: env name %q", ErrInvalidRequest, k)
		}
		q.Add("env", k+"="+v)
	}
	seconds := func(name string, v float64) {
		if v > 0 {
			q.Set(name, strconv.FormatFloat(v, 'f', -1, 64))
		}
	}
	seconds("timeout_seconds", req.TimeoutSeconds)
	seconds("idle_timeout_seconds", req.IdleTimeoutSeconds)
	if req.Rows > 0 && req.Cols > 0 {
		q.Set("rows", strconv.Itoa(int(req.Rows)))
		q.Set("cols", strconv.Itoa(int(req.Cols)))
	}
	p := newProcess(l, "", req.TTY, req.Detach)
	p.lossless = req.Lossless
	// Not retried: a lost reply could leave a process started twice.
	a, err := p.dial(ctx, leasePath(l.id, "exec"), q)
	if err != nil {
		p.cancel()
		return nil, err
	}
	p.id = a.procID
	if p.id == "" {
		p.reattach = false
	}
	p.begin(a, 0)
	return p, nil
}

func newProcess(l *Lease, pid string, tty, reattach bool) *Process {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Process{lease: l, id: pid, tty: tty, reattach: reattach, ctx: ctx, cancel: cancel,
		connChanged: make(chan struct{}), done: make(chan struct{})}
	p.outW, p.errW = newOutPipe(&p.offset), newOutPipe(&p.offset)
	p.Stdout, p.Stderr = p.outW, p.errW
	p.Stdin = stdinWriter{p}
	return p
}

// begin installs the first attachment and starts the reader and the keepalive.
func (p *Process) begin(a attachment, since int64) {
	p.offset.Store(since)
	p.install(a)
	go p.readLoop(a, since)
	go p.keepalive()
}

// ID is the daemon's id of the process, for Attach and Signal.
func (p *Process) ID() string { return p.id }

// Offset is the output offset just past the last byte a Read of Stdout or Stderr
// returned (bytes Lost counted as passed): a later Attach from it continues with the
// next byte, with no repeat and no gap, wherever the last Read ended inside a frame.
// Taken between Reads it is exact; taken during one it may already count that Read's
// bytes.
func (p *Process) Offset() int64 { return p.offset.Load() }

// Lost counts output bytes this handle never delivered because the daemon no longer had
// them when it reattached (or dropped them for a slow reader, unless lossless).
func (p *Process) Lost() int64 { return p.lost.Load() }

// Lossless reports whether the daemon holds the process for this handle rather than drop
// output it has not read.
func (p *Process) Lossless() bool { return p.lossless }

// Wait returns the process's status once its output has been read and it has ended.
func (p *Process) Wait(ctx context.Context) (apitype.Status, error) {
	select {
	case <-p.done:
		return p.status, p.err
	case <-ctx.Done():
		return apitype.Status{}, ctx.Err()
	}
}

// Signal sends a signal ("TERM", "KILL", "INT", …) to the process group.
func (p *Process) Signal(ctx context.Context, name string) error {
	if p.id == "" {
		return fmt.Errorf("%w: the daemon did not name this process", ErrProcessNotFound)
	}
	return p.lease.Signal(ctx, p.id, name)
}

// Resize tells a TTY process its new window size.
func (p *Process) Resize(rows, cols uint16) error {
	b, _ := json.Marshal(apitype.Resize{Width: cols, Height: rows})
	return p.send(apitype.ChannelResize, b)
}

// Close drops the connection and stops reattaching. A background process keeps running;
// a non-detached exec-stream process is killed by the daemon.
func (p *Process) Close() error {
	p.finish(apitype.Status{}, ErrHandleClosed)
	return nil
}

// finish records the outcome once, ends the output streams and the connection.
func (p *Process) finish(st apitype.Status, err error) {
	p.once.Do(func() {
		p.status, p.err = st, err
		p.cancel()
		p.outW.closeWithError(err)
		p.errW.closeWithError(err)
		p.mu.Lock()
		conn := p.conn
		p.mu.Unlock()
		if conn != nil {
			_ = conn.WriteControl(websocket.CloseMessage,
				websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			conn.Close()
		}
		close(p.done)
	})
}

func (p *Process) install(a attachment) {
	a.conn.SetReadLimit(wsBufferSize*16 + 1)
	_ = a.conn.SetReadDeadline(time.Now().Add(readTimeout))
	a.conn.SetPongHandler(func(string) error { return a.conn.SetReadDeadline(time.Now().Add(readTimeout)) })
	p.mu.Lock()
	p.conn = a.conn
	p.proto = a.conn.Subprotocol()
	close(p.connChanged)
	p.connChanged = make(chan struct{})
	p.mu.Unlock()
	select {
	case <-p.ctx.Done(): // closed while dialing
		a.conn.Close()
	default:
	}
}

// readLoop delivers output until the status frame, reattaching after drops.
func (p *Process) readLoop(a attachment, since int64) {
	buf := make([]byte, wsBufferSize)
	failures := 0
	for {
		skip := max(since-a.start, 0) // the daemon replayed from before our offset
		if a.start > since {
			// The bytes in between have left the daemon's buffer: count them and move on.
			a.lost = max(a.lost, a.start-since)
			p.offset.Store(a.start)
		}
		p.lost.Add(a.lost)
		gotFrame, st, err := p.readAttachment(a, skip, buf)
		if err == nil {
			p.finish(st, nil)
			return
		}
		if p.ctx.Err() != nil {
			return
		}
		if gotFrame {
			failures = 0
		}
		if !p.reattach {
			p.finish(apitype.Status{}, fmt.Errorf("%w: %v", ErrConnectionLost, err))
			return
		}
		failures++
		since = p.offset.Load()
		policy := p.lease.c.reconn
		policy.attempts -= failures - 1 // consecutive empty reattaches use up the budget
		if policy.attempts < 1 {
			p.finish(apitype.Status{}, fmt.Errorf("%w: %v", ErrConnectionLost, err))
			return
		}
		p.lease.c.log.Debug("process stream dropped; reattaching", "process", p.id, "offset", since, "err", err)
		next, derr := p.dialRetry(p.ctx, since, policy)
		if derr != nil {
			if p.ctx.Err() == nil {
				p.finish(apitype.Status{}, fmt.Errorf("%w: %v (after %v)", ErrConnectionLost, derr, err))
			}
			return
		}
		p.install(next)
		a = next
	}
}

// readAttachment reads frames of one connection. It returns a nil error only with the
// status frame; otherwise the connection broke (gotFrame says whether it carried anything).
func (p *Process) readAttachment(a attachment, skip int64, buf []byte) (gotFrame bool, st apitype.Status, err error) {
	for {
		typ, r, err := a.conn.NextReader()
		if err != nil {
			return gotFrame, st, err
		}
		_ = a.conn.SetReadDeadline(time.Now().Add(readTimeout))
		var ch [1]byte
		if typ != websocket.BinaryMessage {
			continue
		}
		if _, err := io.ReadFull(r, ch[:]); err != nil {
			continue // an empty message
		}
		gotFrame = true
		switch ch[0] {
		case apitype.ChannelStdout, apitype.ChannelStderr:
			w := p.outW
			if ch[0] == apitype.ChannelStderr && !p.tty {
				w = p.errW
			}
			if skip > 0 {
				n, err := io.CopyN(io.Discard, r, skip)
				skip -= n
				if err != nil && err != io.EOF {
					return gotFrame, st, err
				}
			}
			if err := p.deliver(w, r, buf); err != nil {
				return gotFrame, st, err
			}
		case apitype.ChannelStatus:
			b, err := io.ReadAll(io.LimitReader(r, maxStatusSize))
			if err != nil {
				return gotFrame, st, err
			}
			if err := json.Unmarshal(b, &st); err != nil {
				return gotFrame, st, fmt.Errorf("client: bad status frame: %w", err)
			}
			if extra := st.BytesLost - a.lost; extra > 0 {
				p.lost.Add(extra)
			}
			return gotFrame, st, nil
		}
	}
}

// deliver copies one output frame into the reader's pipe, which advances the offset by
// what the reader took, so a drop mid-frame resumes at the exact byte.
func (p *Process) deliver(w *outPipe, r io.Reader, buf []byte) error {
	for {
		n, rerr := r.Read(buf)
		if n > 0 {
			if _, err := w.write(buf[:n]); err != nil {
				return err // the handle was closed
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// keepalive pings so that a dead connection is noticed by the read deadline.
func (p *Process) keepalive() {
	t := time.NewTicker(pingEvery)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
			p.mu.Lock()
			conn := p.conn
			p.mu.Unlock()
			_ = conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(writeTimeout))
		}
	}
}

// send writes one frame, waiting out a reattach when the connection is down.
func (p *Process) send(channel byte, payload []byte) error {
	msg := make([]byte, 1+len(payload))
	msg[0] = channel
	copy(msg[1:], payload)
	for {
		p.mu.Lock()
		conn, changed := p.conn, p.connChanged
		p.mu.Unlock()
		p.wmu.Lock()
		_ = conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		err := conn.WriteMessage(websocket.BinaryMessage, msg)
		p.wmu.Unlock()
		if err == nil {
			return nil
		}
		if !p.reattach {
			return fmt.Errorf("%w: %v", ErrConnectionLost, err)
		}
		select {
		case <-changed:
		case <-p.done:
			if p.err != nil {
				return p.err
			}
			return fmt.Errorf("%w: the process has ended", ErrStdinClosed)
		}
	}
}

type stdinWriter struct{ p *Process }

func (w stdinWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	closed := w.p.stdinClosed
	w.p.mu.Unlock()
	if closed {
		return 0, ErrStdinClosed
	}
	n := 0
	for len(b) > 0 {
		chunk := b[:min(len(b), maxStdinFrame)]
		if err := w.p.send(apitype.ChannelStdin, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		b = b[len(chunk):]
	}
	return n, nil
}

// Close ends the process's stdin (the "255 0" frame of v5).
func (w stdinWriter) Close() error {
	w.p.mu.Lock()
	if w.p.stdinClosed {
		w.p.mu.Unlock()
		return nil
	}
	w.p.stdinClosed = true
	proto := w.p.proto
	w.p.mu.Unlock()
	if proto != streamProtocolV5 {
		return fmt.Errorf("%w: %s cannot close stdin", ErrStdinClosed, proto)
	}
	return w.p.send(apitype.ChannelClose, []byte{apitype.ChannelStdin})
}

// dialRetry attaches from offset since, retrying connection failures and 503s.
func (p *Process) dialRetry(ctx context.Context, since int64, policy retryPolicy) (attachment, error) {
	q := url.Values{"since": {strconv.FormatInt(since, 10)}}
	if p.lossless {
		q.Set("lossless", "1")
	}
	path := leasePath(p.lease.id, "processes", escapeID(p.id), "attach")
	for attempt := 1; ; attempt++ {
		a, err := p.dial(ctx, path, q)
		if err == nil {
			return a, nil
		}
		var apiErr *APIError
		if errors.As(err, &apiErr) && apiErr.Status != http.StatusServiceUnavailable || errors.Is(err, errors.ErrUnsupported) {
			return a, err
		}
		if attempt >= policy.attempts || ctx.Err() != nil {
			return a, err
		}
		if werr := policy.wait(ctx, attempt); werr != nil {
			return a, err
		}
	}
}

// dial opens one websocket and reads the offsets the daemon put on the 101 reply.
func (p *Process) dial(ctx context.Context, path string, q url.Values) (attachment, error) {
	c := p.lease.c
	u := *c.base
	u.Scheme = "wss"
	u.Path, u.RawPath = "", ""
	target := u.String() + path + "?" + q.Encode()
	h := http.Header{}
	token := p.lease.cred()
	if token == "" {
		token = c.token
	}
	if token != "" {
		h.Set(apitype.HeaderAuthorization, apitype.BearerScheme+" "+token)
	}
	conn, resp, err := c.ws.DialContext(ctx, target, h)
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			defer resp.Body.Close()
			return attachment{}, errorFromResponse(resp)
		}
		return attachment{}, fmt.Errorf("client: attach: %w", withHint(err))
	}
	switch conn.Subprotocol() {
	case streamProtocolV5, streamProtocolV4:
	default:
		conn.Close()
		return attachment{}, fmt.Errorf("client: attach: the daemon chose subprotocol %q, want %s", conn.Subprotocol(), streamProtocolV5)
	}
	if p.lossless && resp.Header.Get(apitype.HeaderOutputMode) != apitype.OutputModeLossless {
		// An older daemon ignores ?lossless: it would drop bytes this caller must not lose.
		conn.Close()
		return attachment{}, fmt.Errorf("client: attach: the daemon does not hold processes for lossless viewers (no %s: %s): %w",
			apitype.HeaderOutputMode, apitype.OutputModeLossless, errors.ErrUnsupported)
	}
	a := attachment{conn: conn, procID: resp.Header.Get(apitype.HeaderProcessID)}
	a.start, _ = strconv.ParseInt(resp.Header.Get(apitype.HeaderOutputOffset), 10, 64)
	if resp.Header.Get(apitype.HeaderOutputOffset) == "" {
		a.start, _ = strconv.ParseInt(q.Get("since"), 10, 64)
	}
	a.lost, _ = strconv.ParseInt(resp.Header.Get(apitype.HeaderBytesLost), 10, 64)
	return a, nil
}
