package network

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"time"
)

// maxHello bounds what is read while looking for a TLS ClientHello's server name.
const maxHello = 16 << 10

// peekServerName reads, without consuming, the server name of a TLS ClientHello at the
// start of br; ok is false when the bytes are not TLS, and name "" when the hello has no
// SNI. It hands the buffered bytes to crypto/tls, which parses the hello and stops.
func peekServerName(br *bufio.Reader) (name string, ok bool) {
	head, err := br.Peek(5)
	if err != nil || head[0] != 0x16 || head[1] != 3 {
		return "", false
	}
	n := 5 + int(head[3])<<8 | int(head[4])
	if n > maxHello {
		return "", false
	}
	hello, err := br.Peek(n)
	if err != nil {
		return "", false
	}
	var got *tls.ClientHelloInfo
	_ = tls.Server(readOnlyConn{r: &sliceReader{b: hello}}, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			got = h
			return nil, errHelloRead
		},
	}).Handshake()
	if got == nil {
		return "", false
	}
	return got.ServerName, true
}

var errHelloRead = errors.New("hello read")

type sliceReader struct{ b []byte }

func (s *sliceReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// readOnlyConn is a net.Conn over a reader whose writes go nowhere: enough for
// crypto/tls to read a ClientHello.
type readOnlyConn struct{ r io.Reader }

func (c readOnlyConn) Read(p []byte) (int, error)     { return c.r.Read(p) }
func (readOnlyConn) Write(p []byte) (int, error)      { return len(p), nil }
func (readOnlyConn) Close() error                     { return nil }
func (readOnlyConn) LocalAddr() net.Addr              { return nil }
func (readOnlyConn) RemoteAddr() net.Addr             { return nil }
func (readOnlyConn) SetDeadline(time.Time) error      { return nil }
func (readOnlyConn) SetReadDeadline(time.Time) error  { return nil }
func (readOnlyConn) SetWriteDeadline(time.Time) error { return nil }
