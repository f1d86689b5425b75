package daemon_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// newFleetMember is newBinDaemon for the i-th of several daemons in one test: its own
// cgroup parent, state dir, port and uid range.
func newFleetMember(t *testing.T, i int, extra ...string) *binDaemon {
	t.Helper()
	needRoot(t)
	first, _ := faultUIDs(256000)
	first += 16_000 * (i + 1) // away from newBinDaemon's range and each other's
	stderr := &testtool.Buffer{}
	b, err := daemontest.New(daemontest.Options{Bin: helperBinary(t), Parent: faultName(t) + "-" + strconv.Itoa(i), Token: testToken,
		UIDFirst: first, UIDLast: first + 15, Env: extra, Output: stderr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeUnmounted(t, b.StateDir) })
	d := &binDaemon{Binary: b, t: t, state: b.StateDir, addr: b.Addr, parent: b.Parent, caFile: b.CAFile, stderr: stderr, client: b.Client}
	t.Cleanup(d.cleanup)
	return d
}

// Three real daemons behind one fleet client: sessions spread by capacity; one daemon
// killed mid-run takes no new lease and the leases on the others run on with 0 errors;
// one drained takes no new lease while its own keep working and re-acquire by session
// id stays on it; a second client (another process) reopens a lease by id alone.
func TestFleetKillAndDrain(t *testing.T) {
	ctx := context.Background()
	env := []string{"SIDECAR_MAX_LEASES=12", "SIDECAR_CAPACITY_MEMORY_BYTES=" + strconv.Itoa(12<<30),
		"SIDECAR_DEFAULT_LIMITS_MEMORY_BYTES=" + strconv.Itoa(1<<30), "SIDECAR_DISK_QUOTA=off"}
	ds := make([]*binDaemon, 3)
	var urls []string
	var pems []byte
	for i := range ds {
		ds[i] = newFleetMember(t, i, env...)
		ds[i].start()
		urls = append(urls, ds[i].URL)
		pem, err := os.ReadFile(ds[i].caFile)
		if err != nil {
			t.Fatal(err)
		}
		pems = append(pems, pem...)
	}
	caFile := filepath.Join(t.TempDir(), "fleet-ca.pem")
	if err := os.WriteFile(caFile, pems, 0o600); err != nil {
		t.Fatal(err)
	}
	newFleet := func() *client.Client {
		c, err := client.New(client.Config{URL: strings.Join(urls, ","), Token: testToken, CAFile: caFile})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	fc := newFleet()
	// on says which daemon holds lease id, asking each directly.
	on := func(id string) int {
		for i, d := range ds {
			if !d.Running() {
				continue
			}
			if _, err := d.client.Get(ctx, id); err == nil {
				return i
			}
		}
		return -1
	}
	type placed struct {
		l      *client.Lease
		member int
	}
	var leases []placed
	acquire := func(session string) placed {
		t.Helper()
		l, err := fc.Acquire(ctx, apitype.AcquireRequest{SessionID: session})
		if err != nil {
			t.Fatalf("acquire %s: %v", session, err)
		}
		p := placed{l, on(l.ID())}
		if p.member < 0 {
			t.Fatalf("lease %s of %s is on no running sidecar", l.ID(), session)
		}
		leases = append(leases, p)
		return p
	}
	count := func(from int) [3]int {
		var n [3]int
		for _, p := range leases[from:] {
			n[p.member]++
		}
		return n
	}

	// 1. Twelve sessions over three daemons: within 4 ± 2 each.
	for i := range 12 {
		acquire(fmt.Sprintf("fleet-%d", i))
	}
	spread := count(0)
	t.Logf("12 sessions over 3 sidecars: %v", spread)
	if slices.Min(spread[:]) < 2 || slices.Max(spread[:]) > 6 {
		t.Fatalf("spread %v: want each within 4 ± 2", spread)
	}
	// Re-acquire by session id through a fresh client finds the lease where it lives.
	other := newFleet()
	again, err := other.Acquire(ctx, apitype.AcquireRequest{SessionID: "fleet-0"})
	if err != nil || again.ID() != leases[0].l.ID() {
		t.Fatalf("re-acquire fleet-0 from another client: %v, id %v want %s", err, again, leases[0].l.ID())
	}
	again.StopRenewing()

	// 2. Kill daemon 0 while the leases on 1 and 2 run commands; place six more meanwhile.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var execErrs []error
	for _, p := range leases {
		if p.member == 0 {
			continue
		}
		wg.Go(func() {
			for range 5 {
				res, err := p.l.Exec(ctx, apitype.ExecRequest{Argv: []string{"echo", "ok"}})
				if err == nil && strings.TrimSpace(res.Stdout) != "ok" {
					err = fmt.Errorf("stdout %q", res.Stdout)
				}
				if err != nil {
					mu.Lock()
					execErrs = append(execErrs, fmt.Errorf("lease on %d: %w", p.member, err))
					mu.Unlock()
				}
			}
		})
	}
	ds[0].kill()
	afterKill := len(leases)
	for i := range 6 {
		acquire(fmt.Sprintf("fleet-k-%d", i))
	}
	wg.Wait()
	if len(execErrs) > 0 {
		t.Fatalf("%d errors on the survivors' leases: %v", len(execErrs), execErrs)
	}
	if n := count(afterKill); n[0] != 0 {
		t.Fatalf("placed after the kill: %v, want none on the dead one", n)
	}
	// Listing covers all: the survivors' leases, and an error naming the dead one.
	all, err := fc.List(ctx)
	if err == nil || !strings.Contains(err.Error(), ds[0].URL) {
		t.Fatalf("list with a dead sidecar: err %v, want one naming %s", err, ds[0].URL)
	}
	if live := len(leases) - count(0)[0]; len(all) != live {
		t.Fatalf("list: %d leases, want the survivors' %d", len(all), live)
	}

	// 3. Drain daemon 1 (by SIGUSR1, as an operator on the host would): new leases go to
	// 2; 1's leases keep working; its session stays.
	draining := func(want bool) {
		t.Helper()
		waitFor(t, fmt.Sprintf("draining=%v in /v1/info", want), 30*time.Second, func() bool {
			info, err := ds[1].client.Info(ctx)
			return err == nil && info.Draining == want
		})
	}
	if err := syscall.Kill(ds[1].Pid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	draining(true)
	afterDrain := len(leases)
	for i := range 4 {
		acquire(fmt.Sprintf("fleet-d-%d", i))
	}
	if n := count(afterDrain); n[2] != 4 {
		t.Fatalf("placed after the drain: %v, want all 4 on the one left", n)
	}
	var onDrained *placed
	for i := range leases {
		if leases[i].member == 1 {
			onDrained = &leases[i]
			break
		}
	}
	if onDrained == nil {
		t.Fatal("no lease on the drained sidecar to check")
	}
	if _, err := onDrained.l.Exec(ctx, apitype.ExecRequest{Argv: []string{"true"}}); err != nil {
		t.Fatalf("exec on the drained sidecar: %v", err)
	}
	session := onDrained.l.Info().SessionID
	back, err := newFleet().Acquire(ctx, apitype.AcquireRequest{SessionID: session})
	if err != nil || back.ID() != onDrained.l.ID() {
		t.Fatalf("re-acquire %s on the drained sidecar: %v (want lease %s)", session, err, onDrained.l.ID())
	}
	back.StopRenewing()

	// 4. A worker with the id and token alone (another process: a fresh client) reaches
	// the lease on its sidecar.
	last := leases[len(leases)-1]
	w := newFleet().OpenLease(last.l.ID(), last.l.Token())
	if res, err := w.Exec(ctx, apitype.ExecRequest{Argv: []string{"echo", "worker"}}); err != nil || strings.TrimSpace(res.Stdout) != "worker" {
		t.Fatalf("worker exec by id: %+v %v", res, err)
	}

	// The drained one's leases run to their end: released, it reports none active.
	for _, p := range leases {
		if p.member == 1 {
			if err := p.l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if st, err := ds[1].client.Drain(ctx, true); err != nil || st.ActiveLeases != 0 {
		t.Fatalf("drained sidecar after its leases ended: %+v %v", st, err)
	}
	if err := syscall.Kill(ds[1].Pid(), syscall.SIGUSR2); err != nil { // the undo
		t.Fatal(err)
	}
	draining(false)
	for _, p := range leases {
		p.l.StopRenewing() // the cleanup releases the rest, the dead one's after a restart
	}
}
