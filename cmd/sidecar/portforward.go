package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/sidecar-sandbox/sidecar/client"
)

func init() {
	register("port-forward", command{summary: "forward local ports to ports inside a lease (port-forward LEASE [LOCAL:]REMOTE...)",
		usage: portForwardUsage, run: runPortForward})
}

const portForwardUsage = `usage: sidecar port-forward LEASE [LOCAL:]REMOTE...

Listens on 127.0.0.1:LOCAL and carries each connection it accepts to port REMOTE inside the
lease (on the lease's loopback or any of its addresses), over the daemon's port-forward
websocket, until Ctrl-C. REMOTE alone listens on the same local port; :REMOTE (or
0:REMOTE) on a free one. As kubectl port-forward:

  sidecar port-forward L1 8000            # 127.0.0.1:8000 -> 8000 in the lease
  sidecar port-forward L1 5433:5432 :6379

Only this machine's loopback listens: whoever can connect to it uses the lease with this
command's credential. For HTTP servers, the daemon's ports route
(/v1/leases/ID/ports/PORT/...) needs no forwarder (docs/api.md, "Network").

Needs SANDBOX_REMOTE_URL and a token: the shared one, or that lease's token.`

// portSpec is one [LOCAL:]REMOTE.
type portSpec struct{ local, remote int }

func parsePortSpec(s string) (portSpec, error) {
	localStr, remoteStr, hasLocal := strings.Cut(s, ":")
	if !hasLocal {
		remoteStr = localStr // REMOTE alone: the same port on both ends
	}
	remote, err := strconv.Atoi(remoteStr)
	if err != nil || remote < 1 || remote > 65535 {
		return portSpec{}, usagef("port-forward %q: the remote port must be 1..65535", s)
	}
	local := 0
	if localStr != "" {
		local, err = strconv.Atoi(localStr)
		if err != nil || local < 0 || local > 65535 {
			return portSpec{}, usagef("port-forward %q: the local port must be 0..65535 (0: a free one)", s)
		}
	}
	return portSpec{local: local, remote: remote}, nil
}

func parsePortForward(args []string) (string, []portSpec, error) {
	fs := newFlagSet("port-forward")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return "", nil, err
	}
	if len(pos) < 2 || pos[0] == "" {
		return "", nil, usageError{portForwardUsage}
	}
	specs := make([]portSpec, 0, len(pos)-1)
	for _, s := range pos[1:] {
		p, err := parsePortSpec(s)
		if err != nil {
			return "", nil, err
		}
		specs = append(specs, p)
	}
	return pos[0], specs, nil
}

func runPortForward(ctx context.Context, args []string) error {
	id, specs, err := parsePortForward(args)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	lease := c.OpenLease(id, "")
	// Fail before listening when the lease is not there or the token does not open it.
	if _, err := lease.Get(ctx); err != nil {
		return err
	}
	listeners := make([]net.Listener, 0, len(specs))
	defer func() {
		for _, ln := range listeners {
			ln.Close()
		}
	}()
	for _, s := range specs {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(s.local)))
		if err != nil {
			return err
		}
		listeners = append(listeners, ln)
	}
	f := &forwarder{lease: lease, stderr: os.Stderr, conns: map[net.Conn]struct{}{}}
	var wg sync.WaitGroup
	for i, ln := range listeners {
		fmt.Printf("Forwarding from %s -> %d\n", ln.Addr(), specs[i].remote)
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.serve(ctx, ln, specs[i].remote)
		}()
	}
	<-ctx.Done() // Ctrl-C (main's signal context)
	for _, ln := range listeners {
		ln.Close()
	}
	f.closeAll()
	wg.Wait()
	return nil
}

// forwarder carries accepted connections to ports in one lease.
type forwarder struct {
	lease  *client.Lease
	stderr io.Writer

	mu    sync.Mutex
	conns map[net.Conn]struct{} // open local and remote ends, closed at the end
	wg    sync.WaitGroup        // one per carried connection
}

// serve accepts on ln until it is closed; each connection is its own websocket.
func (f *forwarder) serve(ctx context.Context, ln net.Listener, remote int) {
	for {
		local, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				fmt.Fprintf(f.stderr, "sidecar: port-forward: accept on %s: %v\n", ln.Addr(), err)
			}
			f.wg.Wait()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.carry(ctx, local, remote)
		}()
	}
}

// carry copies both ways until either side ends; the websocket has no half-close, so
// the first end closes both.
func (f *forwarder) carry(ctx context.Context, local net.Conn, remote int) {
	if !f.track(local) {
		local.Close()
		return
	}
	defer f.untrack(local)
	rc, err := f.lease.DialPort(ctx, remote)
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprintf(f.stderr, "sidecar: port-forward %d: %v\n", remote, err)
		}
		return
	}
	if !f.track(rc) {
		rc.Close()
		return
	}
	defer f.untrack(rc)
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(rc, local); done <- struct{}{} }()
	go func() { _, _ = io.Copy(local, rc); done <- struct{}{} }()
	<-done
	local.Close()
	rc.Close()
	<-done
}

// track registers an open connection; false once closeAll has run.
func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) untrack(c net.Conn) {
	c.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
}

// closeAll closes every open connection and refuses new ones.
func (f *forwarder) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		c.Close()
	}
	f.conns = nil
}
