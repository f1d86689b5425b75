package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/process"
)

// Websocket buffers: gorilla's 4 KiB default halves a fast stream's throughput (0.42 vs
// 0.79 GB/s with 64 KiB: `sidecar-bench -only stream` against a daemon built with each).
const wsBufferSize = 64 << 10

// streamProtocol picks the framing the client offered. gorilla upgrades even when no
// subprotocol matches; we refuse instead, before anything is started.
func streamProtocol(r *http.Request) (string, error) {
	if !websocket.IsWebSocketUpgrade(r) {
		return "", badRequest("this route needs a websocket upgrade")
	}
	offered := websocketProtocols(r)
	for _, p := range []string{apitype.StreamProtocolV5, apitype.StreamProtocolV4} {
		if slices.Contains(offered, p) {
			return p, nil
		}
	}
	return "", badRequest("websocket subprotocol %s (or %s) required", apitype.StreamProtocolV5, apitype.StreamProtocolV4)
}

// frame is one message for the connection's single writer.
type frame struct {
	kind    int // websocket.BinaryMessage, CloseMessage or PingMessage
	channel byte
	data    []byte
}

// stream serves one attachment: the process's output (from sub) goes out, stdin, resize
// and close-channel frames come in. One goroutine writes; the handler goroutine reads.
// With killOnClose, the process tree dies when the client goes away.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, proto string, h http.Header, p *process.Process, sub *process.Subscription, killOnClose bool) error {
	up := websocket.Upgrader{
		ReadBufferSize:  wsBufferSize,
		WriteBufferSize: wsBufferSize,
		Subprotocols:    []string{proto},
		// The route already applied the Origin policy; this repeats it for the upgrade.
		CheckOrigin: s.originAllowed,
	}
	conn, err := up.Upgrade(w, r, h)
	if err != nil {
		sub.Close()
		if killOnClose {
			_ = p.Kill()
		}
		return nil // Upgrade has written the error response.
	}
	if !s.streams.add(conn.NetConn()) {
		_ = conn.Close()
		sub.Close()
		return nil
	}
	defer s.streams.remove(conn.NetConn())
	lim := s.opts.Limits
	log := s.log.With("lease", r.PathValue("id"), "pid", p.ID(), "remote", r.RemoteAddr)

	ctx, cancel := context.WithCancel(context.Background())
	readWait := 2*lim.WSPingInterval + lim.WSWriteTimeout
	reading := &readDeadline{conn: conn}
	out := make(chan frame, 16)
	writerDone := make(chan struct{})
	go func() { // the one writer
		defer close(writerDone)
		defer cancel()
		ping := time.NewTicker(lim.WSPingInterval)
		defer ping.Stop()
		for {
			var f frame
			select {
			case f = <-out:
			case <-ping.C:
				f = frame{kind: websocket.PingMessage}
			case <-ctx.Done():
				return
			}
			_ = conn.SetWriteDeadline(time.Now().Add(lim.WSWriteTimeout))
			if err := writeFrame(conn, f); err != nil {
				// A client that stopped reading (past WSWriteTimeout) or died: end the
				// stream now, not when the reader's own deadline passes (70 s later).
				reading.cut(time.Now())
				return
			}
			if f.kind == websocket.CloseMessage {
				// Give the peer a moment to answer the close, then let the reader end.
				reading.cut(time.Now().Add(5 * time.Second))
				return
			}
		}
	}()
	send := func(f frame) bool {
		select {
		case out <- f:
			return true
		case <-ctx.Done():
			return false
		}
	}

	pumpDone := make(chan struct{})
	go func() { // output → writer; at the end, the status frame and a normal close
		defer close(pumpDone)
		defer sub.Close()
		for {
			c, err := sub.Next(ctx)
			if errors.Is(err, io.EOF) {
				st := statusFrame(p.Status(), sub.Lost())
				b, _ := json.Marshal(st)
				if send(frame{kind: websocket.BinaryMessage, channel: apitype.ChannelStatus, data: b}) {
					send(frame{kind: websocket.CloseMessage, data: websocket.FormatCloseMessage(websocket.CloseNormalClosure, "process exited")})
				}
				return
			}
			if err != nil {
				return
			}
			if !send(frame{kind: websocket.BinaryMessage, channel: c.Channel, data: c.Data}) {
				return
			}
		}
	}()

	// Reader: the handler goroutine. A missed pong or a dead peer ends it.
	conn.SetReadLimit(lim.WSReadLimit)
	_ = reading.extend(readWait)
	conn.SetPongHandler(func(string) error { return reading.extend(readWait) })
	closeWith := func(code int, reason string) {
		send(frame{kind: websocket.CloseMessage, data: websocket.FormatCloseMessage(code, reason)})
	}
	for ctx.Err() == nil {
		kind, msg, err := conn.ReadMessage()
		if err != nil {
			if errors.Is(err, websocket.ErrReadLimit) {
				closeWith(websocket.CloseMessageTooBig, "message over "+strconv.FormatInt(lim.WSReadLimit, 10)+" bytes")
			}
			break
		}
		_ = reading.extend(readWait)
		if kind != websocket.BinaryMessage || len(msg) == 0 {
			closeWith(websocket.CloseUnsupportedData, "binary channel frames only")
			break
		}
		if err := s.control(p, proto, msg[0], msg[1:]); err != nil {
			log.Debug("stream control refused", "err", err)
			closeWith(websocket.CloseProtocolError, err.Error())
			break
		}
	}
	cancel()
	<-pumpDone
	<-writerDone
	_ = conn.Close()
	if killOnClose {
		select {
		case <-p.Done():
		default:
			log.Info("stream closed: killing its process")
			_ = p.Kill()
		}
	}
	return nil
}

// readDeadline is the reader's deadline, which the reader pushes forward as messages
// and pongs arrive and the writer cuts short for good when the stream must end: a cut
// made while the reader handles a message is not undone by its next extend.
type readDeadline struct {
	mu     sync.Mutex
	conn   *websocket.Conn
	cutsAt time.Time // zero until cut
}

func (d *readDeadline) extend(wait time.Duration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := time.Now().Add(wait)
	if !d.cutsAt.IsZero() && d.cutsAt.Before(t) {
		t = d.cutsAt
	}
	return d.conn.SetReadDeadline(t)
}

func (d *readDeadline) cut(at time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cutsAt.IsZero() || at.Before(d.cutsAt) {
		d.cutsAt = at
	}
	_ = d.conn.SetReadDeadline(d.cutsAt)
}

// control applies one client frame.
func (s *Server) control(p *process.Process, proto string, channel byte, payload []byte) error {
	switch channel {
	case apitype.ChannelStdin:
		if _, err := p.WriteStdin(payload); err != nil && !errors.Is(err, process.ErrStdinClosed) {
			return err
		}
		return nil
	case apitype.ChannelResize:
		var rs apitype.Resize
		if err := json.Unmarshal(payload, &rs); err != nil {
			return errors.New("resize: invalid JSON")
		}
		if err := process.CheckSize(rs.Height, rs.Width); err != nil {
			return fmt.Errorf("resize: %w", err)
		}
		if !p.TTY() {
			return nil // Kubernetes ignores resize for a non-TTY stream too.
		}
		return p.Resize(rs.Height, rs.Width)
	case apitype.ChannelClose:
		if proto != apitype.StreamProtocolV5 || len(payload) != 1 {
			return errors.New("close: expected one channel byte (v5 only)")
		}
		if payload[0] == apitype.ChannelStdin {
			return p.CloseStdin()
		}
		return nil
	default:
		return errors.New("unknown channel " + strconv.Itoa(int(channel)))
	}
}

func writeFrame(conn *websocket.Conn, f frame) error {
	switch f.kind {
	case websocket.PingMessage:
		return conn.WriteMessage(websocket.PingMessage, nil)
	case websocket.CloseMessage:
		return conn.WriteMessage(websocket.CloseMessage, f.data)
	}
	// The channel byte and the data go out as one message without a copy.
	wr, err := conn.NextWriter(websocket.BinaryMessage)
	if err != nil {
		return err
	}
	if _, err := wr.Write([]byte{f.channel}); err != nil {
		return err
	}
	if _, err := wr.Write(f.data); err != nil {
		return err
	}
	return wr.Close()
}

// statusFrame is the Kubernetes-shaped status of a finished process.
func statusFrame(ps apitype.Process, lost int64) apitype.Status {
	st := apitype.Status{
		Status:    apitype.StatusSuccess,
		Signal:    ps.Signal,
		TimedOut:  ps.TimedOut,
		OOMKilled: ps.OOMKilled,
		Lost:      ps.State == apitype.ProcessLost,
		BytesLost: lost,
	}
	if ps.ExitCode != nil {
		st.ExitCode = *ps.ExitCode
	}
	switch {
	case st.Lost:
		st.Status, st.Reason, st.Message = apitype.StatusFailure, "Lost", "the daemon restarted while the process ran; its exit status is unknown"
		st.ExitCode = -1
	case ps.Signal != "" || st.ExitCode != 0:
		st.Status, st.Reason = apitype.StatusFailure, apitype.ReasonNonZeroExitCode
		code := st.ExitCode
		if ps.Signal != "" && code == 0 {
			code = 128 + int(unix.SignalNum("SIG"+ps.Signal))
			st.ExitCode = code
		}
		st.Message = "command terminated with non-zero exit code"
		st.Details = &apitype.StatusDetails{Causes: []apitype.StatusCause{{Type: apitype.CauseTypeExitCode, Message: strconv.Itoa(code)}}}
	}
	return st
}
