package network_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/nettest"
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
	"github.com/sidecar-sandbox/sidecar/lease/network"
)

// benchWorld is a lease namespace with an internet policy and a test host that answers
// each connection with size bytes.
func benchWorld(b *testing.B, size int64) (ns func(fn func() error) error, host string) {
	h := nettest.New(b, "198.51.100.0/24")
	ln := h.Listen(b, "tcp", ":9000")
	go func() {
		zeros := make([]byte, 256<<10)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				for left := size; left > 0; {
					n := min(left, int64(len(zeros)))
					if _, err := c.Write(zeros[:n]); err != nil {
						return
					}
					left -= n
				}
			}()
		}
	}()
	leaseNS := nettest.NewNS(b)
	m := network.New(network.Config{Deny: &netpolicy.Deny{HostAddrs: network.HostAddrs}})
	b.Cleanup(m.Close)
	if err := m.Attach("bench", leaseNS, netpolicy.Policy{Egress: netpolicy.EgressInternet}); err != nil {
		b.Fatal(err)
	}
	return func(fn func() error) error { return nettest.InLease(leaseNS, fn) }, net.JoinHostPort(h.Addr.String(), "9000")
}

// tunnel opens a CONNECT tunnel to host from inside the lease.
func tunnel(inLease func(func() error) error, host string) (net.Conn, *bufio.Reader, error) {
	var c net.Conn
	if err := inLease(func() (err error) {
		c, err = net.Dial("tcp", network.ProxyAddr.String())
		return err
	}); err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", host, host)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		c.Close()
		return nil, nil, fmt.Errorf("CONNECT: %v %v", resp, err)
	}
	return c, br, nil
}

// BenchmarkEgressDownload: a download from a test host, from the host's own namespace
// (direct) and from a lease through the daemon's proxy.
func BenchmarkEgressDownload(b *testing.B) {
	const size = 256 << 20
	inLease, host := benchWorld(b, size)
	b.Run("direct", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			c, err := net.Dial("tcp", host)
			if err != nil {
				b.Fatal(err)
			}
			if n, _ := io.Copy(io.Discard, c); n != size {
				b.Fatalf("read %d", n)
			}
			c.Close()
		}
	})
	b.Run("proxied", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			c, br, err := tunnel(inLease, host)
			if err != nil {
				b.Fatal(err)
			}
			if n, _ := io.Copy(io.Discard, br); n != size {
				b.Fatalf("read %d", n)
			}
			c.Close()
		}
	})
}

// BenchmarkEgressConnect: a connection's set-up, direct and through the policy.
func BenchmarkEgressConnect(b *testing.B) {
	inLease, host := benchWorld(b, 1)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			c, err := net.Dial("tcp", host)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.ReadFull(c, make([]byte, 1))
			c.Close()
		}
	})
	b.Run("proxied", func(b *testing.B) {
		for b.Loop() {
			c, br, err := tunnel(inLease, host)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.ReadFull(br, make([]byte, 1))
			c.Close()
		}
	})
}
