package daemon_test

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// fetch8000 asks the lease's loopback port 8000 for / and prints the HTTP status, trying
// for a while (the server may still be starting): 200 times 50 ms, or as many times as
// its argument says.
const fetch8000 = `import sys, time, urllib.request
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 200):
    try:
        print(urllib.request.urlopen("http://127.0.0.1:8000/", timeout=5).status); break
    except OSError:
        time.sleep(0.05)
else:
    print("no answer")`

// running lists the host's processes whose command line (spaces for NULs) holds marker.
func running(t *testing.T, marker string) []string {
	var found []string
	for _, line := range psLines(t) {
		if strings.Contains(line, marker) {
			found = append(found, line)
		}
	}
	return found
}

// The case: a server started with `&` in one exec keeps running (it holds the
// exec's stdout and stderr, which does not hold the reply back), answers the next exec of
// the same lease, is listed in inspection with a pid the lease itself sees, can be killed
// alone, and is gone, with every cgroup of the lease, after the release.
func TestLeftoverServerOutlivesItsExec(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: leftovers live in the lease's cgroups; CI runs as root")
	}
	needPython(t)
	d := startDaemon(t)
	ctx := context.Background()
	l := d.acquireOnce(apitype.AcquireRequest{SessionID: "leftover-server", Network: &apitype.NetworkPolicy{Egress: apitype.EgressNone}})
	t.Cleanup(func() { _ = l.Release(context.Background()) })

	// $! is the pid the lease sees; inspection must list the same number.
	res := must(l.Exec(ctx, sh(`python3 -m http.server 8000 --bind 127.0.0.1 & echo $!`)))(t)
	server, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if err != nil || res.ExitCode != 0 || res.TimedOut {
		t.Fatalf("starting the server: %+v", res)
	}
	res = must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"python3", "-c", fetch8000}, TimeoutSeconds: 60}))(t)
	if strings.TrimSpace(res.Stdout) != "200" {
		t.Fatalf("the next exec got no answer from the server: %+v", res)
	}
	res = must(l.Exec(ctx, sh(`sleep 1006.731 >/dev/null 2>&1 & echo $!`)))(t)
	sleeper, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))

	info := must(d.client.Get(ctx, l.ID()))(t)
	if info.LeftoverCount != 2 || len(info.Leftovers) != 2 {
		t.Fatalf("inspection: %d leftovers %+v, want the server and the sleep", info.LeftoverCount, info.Leftovers)
	}
	i := slices.IndexFunc(info.Leftovers, func(p apitype.Leftover) bool { return p.PID == server })
	if i < 0 {
		t.Fatalf("server %d not among the leftovers %+v", server, info.Leftovers)
	}
	if p := info.Leftovers[i]; !slices.Contains(p.Argv, "http.server") || p.RSSBytes <= 0 || p.StartedAt.IsZero() ||
		p.StartedAt.After(time.Now().Add(time.Second)) {
		t.Fatalf("server as listed: %+v", p)
	}
	list := must(d.client.List(ctx))(t)
	if j := slices.IndexFunc(list, func(x apitype.Lease) bool { return x.ID == l.ID() }); j < 0 || list[j].LeftoverCount != 2 {
		t.Fatalf("the operator listing does not count the leftovers: %+v", list)
	}

	// Only a leftover of this lease can be signalled: not the daemon, not another
	// lease's leftover, not a pid that does not exist.
	other := d.acquireOnce(apitype.AcquireRequest{SessionID: "leftover-other", Network: &apitype.NetworkPolicy{Egress: apitype.EgressNone}})
	t.Cleanup(func() { _ = other.Release(context.Background()) })
	res = must(other.Exec(ctx, sh(`sleep 1007.731 & echo $!`)))(t)
	foreign, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
	// (The forked shell may not have exec'd sleep yet when the exec replies.)
	waitFor(t, "the other lease's leftover", 10*time.Second, func() bool { return len(running(t, "sleep 1007.731")) == 1 })
	for _, pid := range []int{os.Getpid(), foreign, 1 << 30} {
		if err := l.SignalLeftover(ctx, pid, "KILL"); !errors.Is(err, client.ErrProcessNotFound) {
			t.Errorf("signal to %d: %v, want ErrProcessNotFound", pid, err)
		}
	}
	if n := len(running(t, "sleep 1007.731")); n != 1 {
		t.Fatalf("the other lease's leftover: %d processes", n)
	}

	if err := l.SignalLeftover(ctx, server, "TERM"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server to go", 10*time.Second, func() bool {
		info := must(l.Get(ctx))(t)
		return info.LeftoverCount == 1 && info.Leftovers[0].PID == sleeper
	})
	// One try: the server is gone from the leftovers, so nothing is still starting up.
	res = must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"python3", "-c", fetch8000, "1"}, TimeoutSeconds: 60}))(t)
	if strings.TrimSpace(res.Stdout) != "no answer" {
		t.Fatalf("the killed server still answers: %+v", res)
	}

	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitRetired(t, d.cfg.WorkRoot, l.ID())
	if left := running(t, "sleep 1006.731"); len(left) != 0 {
		t.Fatalf("a leftover outlived the release: %v", left)
	}
	if matches := daemontest.LeaseCgroups(d.cfg.CgroupParent, l.ID()); len(matches) != 0 {
		t.Fatalf("cgroups left: %v", matches)
	}
}

// kill_leftovers gives the old behaviour, on exec and on background starts; a timeout
// takes `&` children whatever the flag (TestExecTimeoutKillsTheTree).
func TestKillLeftovers(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	l := d.acquire("kill-leftovers")
	req := sh(`sleep 1008.731 & echo $!`)
	req.KillLeftovers = true
	res := must(l.Exec(ctx, req))(t)
	if res.ExitCode != 0 {
		t.Fatalf("exec: %+v", res)
	}
	if left := running(t, "sleep 1008.731"); len(left) != 0 {
		t.Fatalf("kill_leftovers left %v", left)
	}
	p := must(l.Start(ctx, apitype.StartRequest{Argv: []string{"/bin/sh", "-c", `sleep 1009.731 & echo started`}, KillLeftovers: true}))(t)
	go io.Copy(io.Discard, p.Stderr)
	if out, _ := io.ReadAll(p.Stdout); string(out) != "started\n" {
		t.Fatalf("output %q", out)
	}
	if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if left := running(t, "sleep 1009.731"); len(left) != 0 {
		t.Fatalf("kill_leftovers on a background start left %v", left)
	}
	if info := must(l.Get(ctx))(t); info.LeftoverCount != 0 {
		t.Fatalf("%d leftovers listed", info.LeftoverCount)
	}
}
