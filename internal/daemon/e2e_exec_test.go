package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemon"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
	"github.com/sidecar-sandbox/sidecar/internal/kernel/landlock"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
)

// landlockKernelABI is this kernel's Landlock ABI, 0 without Landlock.
func landlockKernelABI() int { return landlock.ABI() }

// wantLayers are the layers a strict daemon reports on cgroup mode cg with Landlock ABI
// abi, spelled out here rather than computed, as docs/api.md lists them.
func wantLayers(cg string, abi int) []string {
	ls := []string{"cgroup-" + cg, "uid", "mount-ns", "net-ns"}
	for _, l := range []struct {
		abi  int
		name string
	}{{1, "landlock-fs"}, {2, "landlock-fs-refer"}, {3, "landlock-fs-truncate"}, {5, "landlock-fs-ioctl-dev"}, {6, "landlock-scope"}} {
		if abi >= l.abi {
			ls = append(ls, l.name)
		}
	}
	return ls
}

func sh(script string) apitype.ExecRequest {
	return apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, TimeoutSeconds: 60}
}

func TestExecResults(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("exec")
	ctx := context.Background()

	res := must(l.Exec(ctx, sh(`echo out; echo err >&2; exit 7`)))(t)
	if res.ExitCode != 7 || res.Stdout != "out\n" || res.Stderr != "err\n" || res.TimedOut || res.Signal != "" {
		t.Fatalf("exit/out/err: %+v", res)
	}
	res = must(l.Exec(ctx, sh(`kill -TERM $$`)))(t)
	if res.Signal != "TERM" {
		t.Fatalf("signal: %+v", res)
	}
	stdin := "line one\nline two\n"
	req := apitype.ExecRequest{Argv: []string{"cat"}, Stdin: &stdin}
	if res = must(l.Exec(ctx, req))(t); res.Stdout != stdin {
		t.Fatalf("stdin: %+v", res)
	}
	// No stdin given: empty, never the daemon's.
	if res = must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"cat"}}))(t); res.Stdout != "" || res.ExitCode != 0 {
		t.Fatalf("empty stdin: %+v", res)
	}
	// Output beyond the cap keeps its head and its end, flagged, the bytes dropped counted
	// exactly: 3 MiB between a first and a last line that appear nowhere else.
	res = must(l.Exec(ctx, sh(`echo FIRST-LINE; head -c 3145728 /dev/zero | tr '\0' x; echo; echo LAST-LINE`)))(t)
	total := int64(len("FIRST-LINE\n") + 3<<20 + 1 + len("LAST-LINE\n"))
	head, tail := apitype.OutputParts(res.Stdout, res.StdoutDropped, res.StdoutDroppedAt)
	if !res.StdoutTruncated || int64(len(res.Stdout)) != d.cfg.MaxOutputBytes || res.StdoutDropped != total-d.cfg.MaxOutputBytes ||
		int64(len(head)) != d.cfg.MaxOutputBytes/2 || !strings.HasPrefix(head, "FIRST-LINE\nxxx") || !strings.HasSuffix(tail, "xxx\nLAST-LINE\n") {
		t.Fatalf("cap: truncated=%v len=%d dropped=%d at %d, head %.20q… tail …%.20q", res.StdoutTruncated, len(res.Stdout),
			res.StdoutDropped, res.StdoutDroppedAt, head, tail[max(len(tail)-20, 0):])
	}
	if marked := apitype.OutputWithMarker(res.Stdout, res.StdoutDropped, res.StdoutDroppedAt); marked != head+"\n[… "+
		strconv.FormatInt(total-d.cfg.MaxOutputBytes, 10)+" bytes dropped …]\n"+tail {
		t.Fatalf("marker: %.40q", marked[len(head)-5:])
	}
	// output_head_bytes outside 0..max_output_bytes is refused, naming the setting.
	bad := sh("true")
	bad.OutputHeadBytes = new(int64(d.cfg.MaxOutputBytes + 1))
	if _, err := l.Exec(ctx, bad); !errors.Is(err, client.ErrInvalidRequest) || !strings.Contains(err.Error(), "SIDECAR_MAX_OUTPUT_BYTES") {
		t.Fatalf("output_head_bytes over the cap: %v", err)
	}
	// cwd inside the workdir.
	must(l.Exec(ctx, sh(`mkdir -p sub/dir`)))(t)
	if res = must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"pwd"}, Cwd: "sub/dir"}))(t); !strings.HasSuffix(res.Stdout, "/sub/dir\n") {
		t.Fatalf("cwd: %+v", res)
	}
}

func TestExecTimeoutKillsTheTree(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("timeout")
	ctx := context.Background()
	// A grandchild that would outlive its parent, and one that left the session.
	req := sh(`sleep 1000.731 & setsid sleep 1001.731 & echo started; wait`)
	req.TimeoutSeconds = 1
	res := must(l.Exec(ctx, req))(t)
	if !res.TimedOut || res.Stdout != "started\n" {
		t.Fatalf("timeout: %+v", res)
	}
	// Look for the commands on the host, by markers no other test (of any package running
	// in parallel) uses.
	for _, line := range psLines(t) {
		if strings.Contains(line, "sleep 1000.731") || strings.Contains(line, "sleep 1001.731") {
			t.Fatalf("a grandchild survived the timeout: %s", line)
		}
	}
	// Idle timeout: no output for the idle period.
	req = sh(`echo hi; sleep 30`)
	req.IdleTimeoutSeconds = 0.5
	if res = must(l.Exec(ctx, req))(t); !res.TimedOut || res.Stdout != "hi\n" {
		t.Fatalf("idle timeout: %+v", res)
	}
}

func psLines(t *testing.T) []string {
	t.Helper()
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil {
			out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

func TestExecBadInput(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("bad-exec")
	cases := []struct {
		name string
		id   string
		body any
		code string
		st   int
	}{
		{"empty argv", l.ID(), apitype.ExecRequest{}, apitype.CodeInvalidRequest, 400},
		{"cwd outside", l.ID(), apitype.ExecRequest{Argv: []string{"true"}, Cwd: "../.."}, apitype.CodePathOutsideWorkdir, 400},
		{"missing binary", l.ID(), apitype.ExecRequest{Argv: []string{"/no/such/binary"}}, apitype.CodeInvalidRequest, 400},
		{"negative timeout", l.ID(), apitype.ExecRequest{Argv: []string{"true"}, TimeoutSeconds: -1}, apitype.CodeInvalidRequest, 400},
		{"timeout over a day", l.ID(), apitype.ExecRequest{Argv: []string{"true"}, IdleTimeoutSeconds: 86401}, apitype.CodeInvalidRequest, 400},
		{"NUL in argv", l.ID(), apitype.ExecRequest{Argv: []string{"echo", "a\x00b"}}, apitype.CodeInvalidRequest, 400},
		{"bad env", l.ID(), apitype.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A=B": "c"}}, apitype.CodeInvalidRequest, 400},
		{"unknown lease", "lnosuch", apitype.ExecRequest{Argv: []string{"true"}}, apitype.CodeLeaseNotFound, 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, hdr, body := d.raw("POST", "/v1/leases/"+c.id+"/exec", testToken, jsonBody(c.body), nil)
			wantProblem(t, status, hdr, body, c.st, c.code)
		})
	}
}

func TestExecEnvironmentIsClean(t *testing.T) {
	t.Setenv("SIDECAR_SECRET_PROBE", "do-not-leak")
	d := startDaemon(t)
	l := d.acquire("env")
	res := must(l.Exec(context.Background(), apitype.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"MINE": "yes"}}))(t)
	if strings.Contains(res.Stdout, "do-not-leak") || strings.Contains(res.Stdout, testToken) || strings.Contains(res.Stdout, "SIDECAR_") {
		t.Fatalf("daemon environment leaked:\n%s", res.Stdout)
	}
	if !strings.Contains(res.Stdout, "MINE=yes") || !strings.Contains(res.Stdout, "HOME=") {
		t.Fatalf("env lacks the request's or the base variables:\n%s", res.Stdout)
	}
	res = must(l.Exec(context.Background(), sh(`ls /proc/self/fd`)))(t)
	fds := strings.Fields(res.Stdout)
	// 0-2 plus the descriptor ls opens to read the directory.
	if len(fds) > 4 {
		t.Fatalf("inherited descriptors: %v", fds)
	}
}

// Leases on one host must not reach each other, the daemon or the host, at every Landlock
// ABI the helper branches on (capped on this kernel): below ABI 6 the lease uid is what
// stops signals, without Landlock uid and file modes are all that guard the filesystem.
func TestLeasesAreIsolated(t *testing.T) {
	needRoot(t)
	kernel := landlockKernelABI()
	for _, cap := range []int{sandbox.NoLandlock, 1, 2, 3, 5, 6, 0} {
		if cap > 0 && cap >= kernel || cap == sandbox.NoLandlock && kernel == 0 {
			continue // not below the kernel's: the uncapped run (0) covers it
		}
		t.Run(fmt.Sprintf("landlock-cap%d", cap), func(t *testing.T) {
			d := startDaemon(t, func(c *daemon.Config) { c.LandlockMaxABI = cap })
			testLeasesAreIsolated(t, d)
		})
	}
}

func testLeasesAreIsolated(t *testing.T, d *testDaemon) {
	info := must(d.client.Info(context.Background()))(t)
	abi := info.Capabilities.Landlock
	if want := strings.Join(wantLayers(info.Capabilities.Cgroups, abi), ","); strings.Join(info.Capabilities.Layers, ",") != want {
		t.Fatalf("info layers %q at Landlock ABI %d, want %q", info.Capabilities.Layers, abi, want)
	}
	a := d.acquire("iso-a")
	b := d.acquire("iso-b")
	ctx := context.Background()
	must(b.Exec(ctx, sh(`echo secret-b > mine.txt; echo tmp-b > /tmp/b.txt; sleep 300 & echo $! > sleeper.pid`)))(t)
	bWork := filepath.Join(d.cfg.WorkRoot, b.ID(), "work")
	bPid := strings.TrimSpace(string(must(b.ReadFile(ctx, "sleeper.pid"))(t)))

	probes := map[string]string{
		"read B's workdir":          fmt.Sprintf(`cat %s/mine.txt`, bWork),
		"list B's workdir":          fmt.Sprintf(`ls %s`, bWork),
		"see B's /tmp":              `cat /tmp/b.txt`,
		"signal B's process":        `kill -0 ` + bPid,
		"signal the daemon":         fmt.Sprintf(`kill -0 %d`, os.Getpid()),
		"read the daemon's environ": fmt.Sprintf(`cat /proc/%d/environ`, os.Getpid()),
		"write to /etc":             `echo x > /etc/sidecar-escape`,
		"write to /var/tmp":         `echo x > /var/tmp/sidecar-escape`,
		"write to /dev/shm":         `echo x > /dev/shm/sidecar-escape`,
		"write to the work root":    fmt.Sprintf(`echo x > %s/escape`, d.cfg.WorkRoot),
		"read the state dir":        fmt.Sprintf(`ls %s`, d.cfg.StateDir),
		"see B's process in /proc":  `test -e /proc/` + bPid,
		"see the daemon in /proc":   fmt.Sprintf(`test -e /proc/%d`, os.Getpid()),
	}
	if abi == 0 {
		// The documented gap without Landlock (docs/operations.md): world-writable host
		// directories are shared. Everything else holds on uid, modes and namespaces.
		delete(probes, "write to /var/tmp")
		delete(probes, "write to /dev/shm")
	}
	for name, script := range probes {
		t.Run(name, func(t *testing.T) {
			res := must(a.Exec(ctx, sh(script)))(t)
			if res.ExitCode == 0 {
				t.Fatalf("lease A could %s: %+v", name, res)
			}
		})
	}
	for _, p := range []string{"/etc/sidecar-escape", "/var/tmp/sidecar-escape", "/dev/shm/sidecar-escape", filepath.Join(d.cfg.WorkRoot, "escape")} {
		if _, err := os.Stat(p); err == nil {
			os.Remove(p)
			t.Errorf("%s was written from a lease", p)
		}
	}
	// B's mount table, made after A's disk was mounted, holds no lease's mounts: none under
	// the state dir or the work root (docs/operations.md).
	mounts := must(b.Exec(ctx, sh(`cut -d' ' -f5 /proc/self/mountinfo`)))(t)
	for _, p := range strings.Fields(mounts.Stdout) {
		for _, root := range []string{d.cfg.StateDir, d.cfg.WorkRoot} {
			if p == root || strings.HasPrefix(p, root+"/") {
				t.Errorf("lease B sees a mount at %s", p)
			}
		}
	}
	if !strings.Contains(mounts.Stdout, "/workspace\n") {
		t.Errorf("lease B has no /workspace mount: %q", mounts.Stdout)
	}
	// Lease processes are the OOM killer's first choice, not protected like the daemon.
	if r := must(a.Exec(ctx, sh(`cat /proc/self/oom_score_adj`)))(t); r.Stdout != "500\n" {
		t.Fatalf("oom_score_adj in a lease: %+v", r)
	}
	// Its own workdir and /tmp work.
	res := must(a.Exec(ctx, sh(`echo ok > here.txt && echo ok > /tmp/t.txt && cat here.txt /tmp/t.txt && id -u`)))(t)
	if res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "ok\nok\n") {
		t.Fatalf("own workdir and /tmp: %+v", res)
	}
	if uid := strings.TrimSpace(strings.TrimPrefix(res.Stdout, "ok\nok\n")); uid == "0" {
		t.Fatal("lease runs as root")
	}
}

// A fork bomb and a memory hog in lease A stop at A's limits; lease B keeps working.
func TestLimitsContainOneLease(t *testing.T) {
	needRoot(t)
	d := startDaemon(t)
	ctx := context.Background()
	a, err := d.client.Acquire(ctx, apitype.AcquireRequest{SessionID: "hog", Limits: apitype.Limits{Pids: 64, MemoryBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Release(context.Background()) })
	b := d.acquire("bystander")

	bomb := sh(`bomb() { bomb | bomb & }; bomb; sleep 2; echo survived`)
	bomb.TimeoutSeconds = 5
	// What the bomb leaves would hold every pid of A until the release: this test is
	// about the limit, so the exec takes its tree with it.
	bomb.KillLeftovers = true
	res := must(a.Exec(ctx, bomb))(t)
	if res.ExitCode == 0 && !res.TimedOut {
		t.Logf("fork bomb result: %+v", res)
	}
	info := must(d.client.Get(ctx, a.ID()))(t)
	if info.Usage == nil || info.Usage.Pids > 64 {
		t.Fatalf("pids over the limit or no usage: %+v", info.Usage)
	}
	if r := must(b.Exec(ctx, sh(`echo alive`)))(t); r.Stdout != "alive\n" {
		t.Fatalf("bystander: %+v", r)
	}

	hog := apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", `a=x; while true; do a="$a$a"; done`}, TimeoutSeconds: 60}
	res = must(a.Exec(ctx, hog))(t)
	if !res.OOMKilled {
		t.Fatalf("memory hog not reported as OOM-killed: %+v", res)
	}
	if r := must(b.Exec(ctx, sh(`echo alive`)))(t); r.Stdout != "alive\n" {
		t.Fatalf("bystander after OOM: %+v", r)
	}
	// Inspection reports what the lease used, read from its cgroup.
	info = must(d.client.Get(ctx, a.ID()))(t)
	if u := info.Usage; u == nil || u.OOMKills < 1 || u.CPUSeconds <= 0 {
		t.Fatalf("usage after the fork bomb and the OOM kill: %+v", u)
	}
}

// A released lease leaves no process, cgroup or workdir.
func TestReleaseLeavesNothing(t *testing.T) {
	d := startDaemon(t)
	ctx := context.Background()
	l := d.acquireOnce(apitype.AcquireRequest{SessionID: "leaver"})
	must(l.Exec(ctx, sh(`(setsid sleep 1002.731 &) ; nohup sleep 1003.731 >/dev/null 2>&1 & sleep 1004.731 >/dev/null 2>&1 & echo x > f`)))(t)
	if os.Geteuid() == 0 {
		// They outlive their exec, as the lease's leftovers, until the release (busybox's
		// nohup, in the VM suite, may quit at once: the other two are what is counted).
		info := must(l.Get(ctx))(t)
		var argvs []string
		for _, lo := range info.Leftovers {
			argvs = append(argvs, strings.Join(lo.Argv, " "))
		}
		if !slices.Contains(argvs, "sleep 1002.731") || !slices.Contains(argvs, "sleep 1004.731") || info.LeftoverCount != len(info.Leftovers) {
			t.Fatalf("leftovers before the release: %d %q", info.LeftoverCount, argvs)
		}
	}
	dir := filepath.Join(d.cfg.WorkRoot, l.ID())
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("lease dir missing before release: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitRetired(t, d.cfg.WorkRoot, l.ID())
	for _, line := range psLines(t) {
		if strings.Contains(line, "sleep 1002.731") || strings.Contains(line, "sleep 1003.731") || strings.Contains(line, "sleep 1004.731") {
			t.Fatalf("a lease process outlived the lease: %s", line)
		}
	}
	if os.Geteuid() == 0 {
		if matches := daemontest.LeaseCgroups(d.cfg.CgroupParent, l.ID()); len(matches) != 0 {
			t.Fatalf("cgroups left: %v", matches)
		}
	}
	if _, err := l.Exec(ctx, sh("true")); !errors.Is(err, client.ErrLeaseNotFound) {
		t.Fatalf("exec on a released lease: %v", err)
	}
}

// Through the real daemon, a lease can neither make a user namespace nor open a raw socket
// (the helper's seccomp filter; sandbox's TestKernelSurfaceDenied probes each call), and has
// the documented open-file limit.
func TestExecKernelSurfaceDenied(t *testing.T) {
	needRoot(t)
	needPython(t)
	d := startDaemon(t)
	l := d.acquire("seccomp")
	ctx := context.Background()
	res := must(l.Exec(ctx, sh(`unshare -Ur true && echo userns; unshare -rn true && echo netns; `+
		`python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' 2>/dev/null && echo raw; ulimit -n`)))(t)
	if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "4096" {
		t.Fatalf("exit %d, stdout %q (want only the open-file limit 4096), stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
}

// SIDECAR_LEASE_PATH reaches a lease through the daemon: its directory follows the
// default PATH, and an exec runs a tool from it by name.
func TestLeasePathReachesLeases(t *testing.T) {
	dir, err := os.MkdirTemp("/usr/local", "sidecar-e2e-path-") // where leases may run programs
	if err != nil {
		t.Skipf("no directory under /usr/local: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sidecar-e2e-tool"), []byte("#!/bin/sh\necho from the lease path\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, func(c *daemon.Config) { c.LeasePath = dir })
	l := d.acquire("lease-path")
	ctx := context.Background()
	if res := must(l.Exec(ctx, sh(`echo "$PATH"`)))(t); res.Stdout != sandbox.DefaultPath+":"+dir+"\n" {
		t.Fatalf("lease PATH %q, want the default then %s", res.Stdout, dir)
	}
	if res := must(l.Exec(ctx, apitype.ExecRequest{Argv: []string{"sidecar-e2e-tool"}}))(t); res.Stdout != "from the lease path\n" || res.ExitCode != 0 {
		t.Fatalf("tool by name: %+v", res)
	}
}
