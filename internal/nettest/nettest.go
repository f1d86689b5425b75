// Package nettest makes test hosts for network tests: each a network namespace of the
// test's own, joined to the test's (host) namespace by a veth pair, with an address on
// each end. Tests reach them from the host's namespace as a lease's egress would. Each
// host is removed when its test ends. It needs root and `ip` (iproute2).
package nettest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
	"github.com/sidecar-sandbox/sidecar/lease/network"
)

// Host is one test host.
type Host struct {
	Name string     // its namespace, under /run/netns
	Addr netip.Addr // its address
	Peer netip.Addr // the host-side end of its link (an address of the test's namespace)
}

// Require skips a test that cannot make hosts: not root, or no `ip` (which fails the test
// under SIDECAR_TEST_REQUIRE_ALL=1, as CI runs it, as root).
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("test hosts need root (network namespaces and veth links)")
	}
	ipPath = testtool.Need(t, "ip", "iproute2", "test hosts are network namespaces joined by veth links")
}

// ipPath is iproute2's ip, found by Require.
var ipPath = "ip"

// New makes a host whose address is in prefix (a /24 or wider, e.g. 198.51.100.0/24, a
// documentation range the tests treat as public): a random /30 of it, so that tests in
// parallel packages do not collide. extra addresses are added to the host's interface too
// (169.254.169.254, say) with routes to them through the link; one test at a time, across
// packages, holds an extra address (a lock file per address, held until the test ends).
func New(t testing.TB, prefix string, extra ...string) *Host {
	t.Helper()
	Require(t)
	for _, e := range extra {
		lockAddress(t, e)
	}
	p := netip.MustParsePrefix(prefix)
	for try := 0; try < 200; try++ {
		base := p.Addr().As4()
		block := rand.IntN(1 << (30 - p.Bits()))
		v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
		v += uint32(block) << 2
		peer := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v + 1)})
		addr := peer.Next()
		if !tryLockAddress(t, peer.String()) {
			continue // another test's block
		}
		h := &Host{Name: fmt.Sprintf("sctest%06x", rand.IntN(1<<24)), Addr: addr, Peer: peer}
		if err := h.create(extra); err != nil {
			h.remove()
			if strings.Contains(err.Error(), "exists") {
				continue
			}
			t.Fatalf("test host: %v", err)
		}
		t.Cleanup(h.remove)
		return h
	}
	t.Fatal("test host: no free address block")
	return nil
}

func (h *Host) links() (string, string) { return "h" + h.Name[6:], "p" + h.Name[6:] }

func (h *Host) create(extra []string) error {
	hl, pl := h.links()
	cmds := [][]string{
		{"netns", "add", h.Name},
		{"link", "add", hl, "type", "veth", "peer", "name", pl, "netns", h.Name},
		{"addr", "add", h.Peer.String() + "/30", "dev", hl},
		{"link", "set", hl, "up"},
		{"-n", h.Name, "addr", "add", h.Addr.String() + "/30", "dev", pl},
		{"-n", h.Name, "link", "set", pl, "up"},
		{"-n", h.Name, "link", "set", "lo", "up"},
		{"-n", h.Name, "route", "add", "default", "via", h.Peer.String()},
	}
	for _, e := range extra {
		cmds = append(cmds,
			[]string{"-n", h.Name, "addr", "add", e + "/32", "dev", pl},
			[]string{"route", "add", e + "/32", "via", h.Addr.String(), "dev", hl})
	}
	for _, c := range cmds {
		if out, err := exec.Command(ipPath, c...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	return nil
}

// remove deletes the namespace (which takes the veth pair and the routes through it).
func (h *Host) remove() {
	hl, _ := h.links()
	_ = exec.Command(ipPath, "link", "del", hl).Run()
	_ = exec.Command(ipPath, "netns", "del", h.Name).Run()
}

// Listen opens a listener inside the host, on addr (e.g. ":443" for every address of it).
func (h *Host) Listen(t testing.TB, network, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	err := h.in(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen in test host %s: %v", h.Name, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// in runs fn on a thread inside the host's namespace (see lease/network for why a
// locked thread).
func (h *Host) in(fn func() error) error {
	ns, err := os.Open("/run/netns/" + h.Name)
	if err != nil {
		return err
	}
	defer ns.Close()
	return network.InNetNS(ns, fn)
}

// NewNS makes an empty network namespace with loopback up, as a lease's, closed when the
// test ends.
func NewNS(t testing.TB) *os.File {
	t.Helper()
	Require(t)
	name := fmt.Sprintf("sclease%06x", rand.IntN(1<<24))
	for _, c := range [][]string{{"netns", "add", name}, {"-n", name, "link", "set", "lo", "up"}} {
		if out, err := exec.Command(ipPath, c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
	ns, err := os.Open("/run/netns/" + name)
	_ = exec.Command(ipPath, "netns", "del", name).Run() // the open descriptor keeps it alive
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// InLease runs fn inside the namespace ns (a lease's, from NewNS).
func InLease(ns *os.File, fn func() error) error { return network.InNetNS(ns, fn) }

// lockAddress waits for, then holds until the test ends, the host-wide lock on addr.
func lockAddress(t testing.TB, addr string) {
	t.Helper()
	flockAddress(t, addr, unix.LOCK_EX)
}

// tryLockAddress takes the lock on addr if no other test holds it.
func tryLockAddress(t testing.TB, addr string) bool {
	t.Helper()
	return flockAddress(t, addr, unix.LOCK_EX|unix.LOCK_NB)
}

func flockAddress(t testing.TB, addr string, how int) bool {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "sidecar-nettest-"+addr+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return false
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
	return true
}

// DNS answers A questions for names from a server on the test's loopback, NXDOMAIN for
// other names, until the test ends; it returns the server's address.
func DNS(t testing.TB, names map[string]netip.Addr) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if out := answerA(buf[:n], names); out != nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	return pc.LocalAddr().String()
}

func answerA(query []byte, names map[string]netip.Addr) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	a, ok := names[strings.TrimSuffix(q.Name.String(), ".")]
	rc := dnsmessage.RCodeSuccess
	if !ok {
		rc = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RCode: rc})
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	if ok && q.Type == dnsmessage.TypeA && a.Is4() {
		_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: a.As4()})
	}
	out, _ := b.Finish()
	return out
}

// Resolver resolves through the DNS server at addr.
func Resolver(addr string) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}
