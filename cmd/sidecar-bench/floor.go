package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os/exec"
	"time"
)

// tlsFloor is an in-process TLS 1.3 server on loopback that reads everything a connection
// sends and then answers one byte: the fastest any HTTPS transfer here could be.
type tlsFloor struct {
	ln     net.Listener
	client *tls.Config
	buf    []byte
}

func newTLSFloor() (*tlsFloor, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13})
	if err != nil {
		return nil, err
	}
	f := &tlsFloor{ln: ln, client: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}, // the floor's own throwaway cert
		buf: make([]byte, 256<<10)}
	_, _ = rand.Read(f.buf)
	go f.serve()
	return f, nil
}

func (f *tlsFloor) serve() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 256<<10)
			if _, err := io.CopyBuffer(io.Discard, c, buf); err == nil {
				_, _ = c.Write([]byte{1})
			}
		}()
	}
}

// send pushes n bytes through a fresh TLS connection and waits for the server to have
// read them all.
func (f *tlsFloor) send(n int64) error {
	c, err := tls.Dial("tcp", f.ln.Addr().String(), f.client)
	if err != nil {
		return err
	}
	defer c.Close()
	for left := n; left > 0; {
		k := min(left, int64(len(f.buf)))
		if _, err := c.Write(f.buf[:k]); err != nil {
			return err
		}
		left -= k
	}
	if err := c.CloseWrite(); err != nil {
		return err
	}
	ack := make([]byte, 1)
	if _, err := io.ReadFull(c, ack); err != nil {
		return fmt.Errorf("tls floor: no acknowledgement: %w", err)
	}
	return nil
}

func (f *tlsFloor) close() { f.ln.Close() }

// runCmd runs cmd and puts its stderr into the error.
func runCmd(cmd *exec.Cmd) error {
	var errBuf bytes.Buffer
	if cmd.Stderr == nil {
		cmd.Stderr = &errBuf
	}
	if cmd.Stdout == nil {
		cmd.Stdout = discardCounter{}
	}
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		msg := bytes.TrimSpace(errBuf.Bytes())
		if len(msg) > 500 {
			msg = msg[len(msg)-500:]
		}
		return errors.Join(err, fmt.Errorf("%s: %s", cmd.Args[0], msg))
	}
	return nil
}
