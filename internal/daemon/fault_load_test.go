package daemon_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/cmd/sidecar-soak/workload"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// The short soak: many leases acquiring, running, transferring and releasing at once in
// the in-process daemon (under -race in CI), then a count of everything that could
// leak. cmd/sidecar-soak is the long version against the built daemon.

// loadDuration is 8 s by default; SIDECAR_LOAD_SECONDS changes it.
func loadDuration(t *testing.T) time.Duration {
	if v := os.Getenv("SIDECAR_LOAD_SECONDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SIDECAR_LOAD_SECONDS=%q", v)
		}
		return time.Duration(n) * time.Second
	}
	return 8 * time.Second
}

// resources is what a daemon holds that a leak would grow.
type resources struct {
	goroutines, fds, cgroups, leaseDirs, uidProcs int
	heap                                          uint64
}

func (r resources) String() string {
	return fmt.Sprintf("goroutines %d, fds %d, cgroups %d, lease dirs %d, processes of lease uids %d, heap %d KiB",
		r.goroutines, r.fds, r.cgroups, r.leaseDirs, r.uidProcs, r.heap>>10)
}

func countResources(d *testDaemon) resources {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	fds, _ := os.ReadDir("/proc/self/fd")
	dirs := leaseEntries(d.cfg.WorkRoot)
	cg := 0
	for _, p := range daemontest.CgroupParents(d.cfg.CgroupParent) {
		entries, _ := os.ReadDir(p)
		for _, e := range entries {
			if e.IsDir() {
				cg++
			}
		}
	}
	return resources{
		goroutines: runtime.NumGoroutine(), fds: len(fds), cgroups: cg, leaseDirs: len(dirs),
		uidProcs: len(workload.ProcsOfUIDs(d.cfg.UIDFirst, d.cfg.UIDLast)), heap: ms.HeapInuse,
	}
}

// procsOfUIDs lists processes whose real uid lies in [first, last].

// loadClient is a client whose idle connections the test can close, so that
// connection counts settle.
func (d *testDaemon) loadClient(t *testing.T) (*client.Client, *http.Transport) {
	pem, err := os.ReadFile(d.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 32}
	c, err := client.New(client.Config{URL: d.url, Token: testToken, HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	return c, tr
}

func TestFaultLoadNoLeaks(t *testing.T) {
	needRoot(t) // uids, cgroups: the things that could leak
	const leases = 16
	d := startFaultDaemon(t, func(c *daemon.Config) {
		// Room above the workers: TestFaultConcurrentAcquireAtLimit covers the limit.
		c.MaxLeases = 2 * leases
		c.UIDFirst, c.UIDLast = faultUIDs(272000) // this test's own uids, counted in /proc
	})
	c, tr := d.loadClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	payload := randomBytes(t, 256<<10)

	// A warm-up round makes the one-time things (pools, TLS sessions, cgroup parents).
	if _, err := workload.Round(ctx, c, "warm-up", 5*time.Minute, payload); err != nil {
		t.Fatal(err)
	}
	tr.CloseIdleConnections()
	idle := settled(t, d, nil)
	t.Logf("idle: %v", idle)

	deadline := time.Now().Add(loadDuration(t))
	var mu sync.Mutex
	var lat []time.Duration
	var errs []error
	rounds := 0
	var wg sync.WaitGroup
	for w := range leases {
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				l, err := workload.Round(ctx, c, fmt.Sprintf("load-%d-%d", w, i), 5*time.Minute, payload)
				mu.Lock()
				lat = append(lat, l...)
				rounds++
				if err != nil {
					errs = append(errs, fmt.Errorf("worker %d round %d: %w", w, i, err))
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors in %d rounds: %v", len(errs), rounds, errors.Join(errs...))
	}
	slices.Sort(lat)
	p99 := lat[len(lat)*99/100]
	t.Logf("%d leases at once: %d rounds, %d operations, 0 errors, p99 %v", leases, rounds, len(lat), p99)

	tr.CloseIdleConnections()
	after := settled(t, d, &idle)
	t.Logf("after: %v", after)
	if left := must(c.List(ctx))(t); len(left) != 0 {
		t.Fatalf("leases left: %d", len(left))
	}
}

// settled waits (bounded) for the resource counts to stop falling and, when want is
// given, to be back at it: no goroutine, descriptor, cgroup, lease dir or lease-uid
// process more than at idle, and the heap within 16 MiB of its idle size.
func settled(t *testing.T, d *testDaemon, want *resources) resources {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var r resources
	for {
		r = countResources(d)
		if want == nil {
			if r.cgroups == 0 && r.uidProcs == 0 && r.leaseDirs == 0 {
				return r
			}
		} else if r.goroutines <= want.goroutines && r.fds <= want.fds && r.cgroups <= want.cgroups &&
			r.leaseDirs <= want.leaseDirs && r.uidProcs == 0 && r.heap <= want.heap+16<<20 {
			return r
		}
		if time.Now().After(deadline) {
			if want != nil {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Fatalf("leaked after the load:\n  idle  %v\n  after %v\n%s", *want, r, buf[:n])
			}
			t.Fatalf("the daemon never became idle: %v", r)
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// N leases acquired at once under a limit of N all succeed: a lease being created must
// count once against the limit, not twice.
func TestFaultConcurrentAcquireAtLimit(t *testing.T) {
	const limit = 8
	d := startFaultDaemon(t, func(c *daemon.Config) { c.MaxLeases = limit })
	ctx := context.Background()
	for round := range 4 {
		var wg sync.WaitGroup
		errs := make([]error, limit)
		ids := make([]string, limit)
		for i := range limit {
			wg.Go(func() {
				l, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: fmt.Sprintf("at-limit-%d-%d", round, i)})
				if err == nil {
					ids[i] = l.ID()
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for _, id := range ids {
			if id != "" {
				if err := d.client.Release(ctx, id); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("BUG: round %d: %d acquires at once under a limit of %d: %v\n"+
				"(lease.Manager.create puts the new lease in m.leases before it leaves m.creating, and Acquire "+
				"counts len(m.leases)+len(m.creating): during the persist a lease counts twice)", round, limit, limit, err)
		}
	}
}
