package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
)

// A shell session through the real daemon and client: state carries over, framing is
// exact, stdin readers return, a timeout leaves the session usable, a busy session refuses.
func TestShellSession(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("shell")
	ctx := context.Background()
	sh, st := must2(l.NewShell(ctx, apitype.ShellCreateRequest{}))(t)
	if st.Shell != "bash" || st.Busy || st.Cwd != "" {
		t.Fatalf("new session: %+v", st)
	}
	run := func(cmd string, timeout time.Duration) apitype.ShellResult {
		t.Helper()
		res, err := sh.Run(ctx, cmd, timeout)
		if err != nil {
			t.Fatalf("run %q: %v", cmd, err)
		}
		return res
	}
	// The lease's own working directory, however the lease shows it.
	home := strings.TrimSuffix(run("pwd; mkdir sub", 0).Stdout, "\n")
	if res := run("cd sub && export A=1", 0); res.ExitCode != 0 || res.Cwd != home+"/sub" {
		t.Fatalf("cd: %+v", res)
	}
	if res := run("pwd; echo $A", 0); res.Stdout != home+"/sub\n1\n" || res.ExitCode != 0 {
		t.Fatalf("pwd; echo $A: %+v, want %q", res, home+"/sub\n1\n")
	}
	if res := run("echo out; echo err >&2; (exit 5)", 0); res.Stdout != "out\n" || res.Stderr != "err\n" || res.ExitCode != 5 {
		t.Fatalf("streams: %+v", res)
	}
	if res := run("printf 'SCFAKE0:/:SCFAKE\\n'; printf 'no newline'", 0); res.Stdout != "SCFAKE0:/:SCFAKE\nno newline" {
		t.Fatalf("marker-like output: %q", res.Stdout)
	}
	if res := run("printf '\\000\\001 bin'", 0); res.Stdout != "\x00\x01 bin" {
		t.Fatalf("binary output: %q", res.Stdout)
	}
	if res := run("cat; read x; echo read=$?", 30*time.Second); res.TimedOut || res.Stdout != "read=1\n" {
		t.Fatalf("stdin readers: %+v", res)
	}
	run("sleep 300 & echo $! > ../bg.pid", 0)
	if res := run("sleep 100", 500*time.Millisecond); !res.TimedOut || res.Ended {
		t.Fatalf("timeout: %+v", res)
	}
	if res := run("echo $A; kill -0 $(cat ../bg.pid) && echo bg", 0); res.Stdout != "1\nbg\n" {
		t.Fatalf("after a timeout: %+v", res)
	}
	// The session's jobs stay the session's: a later command sees and stops them.
	if res := run("[ -d /proc/$(cat ../bg.pid) ] && echo seen; kill %1; wait %1; echo $?", 0); res.Stdout != "seen\n143\n" {
		t.Fatalf("a job of an earlier command, stopped by a later one: %+v", res)
	}

	// One command at a time.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _, _ = sh.Run(ctx, "sleep 100", time.Second) }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if s, err := sh.Status(ctx); err == nil && s.Busy {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := sh.Run(ctx, "true", 0); !errors.Is(err, client.ErrShellBusy) {
		t.Fatalf("concurrent run: %v", err)
	}
	status, hdr, body := d.raw("POST", "/v1/leases/"+l.ID()+"/shells/"+sh.ID()+"/run", testToken, jsonBody(apitype.ShellRunRequest{Command: "true"}), nil)
	wantProblem(t, status, hdr, body, http.StatusConflict, apitype.CodeShellBusy)
	wg.Wait()

	// Listed, with its state; its shell is one of the lease's processes.
	list := must(l.Shells(ctx))(t)
	if len(list) != 1 || list[0].ID != sh.ID() || list[0].Cwd != home+"/sub" || list[0].LastExitCode == nil {
		t.Fatalf("list: %+v", list)
	}
	if p, err := l.Process(ctx, sh.ID()); err != nil || p.State != apitype.ProcessRunning {
		t.Fatalf("shell process: %+v %v", p, err)
	}
	// Bad input has its codes.
	if _, err := sh.Run(ctx, "", 0); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("empty command: %v", err)
	}
	if _, err := l.Shell("nosuch").Run(ctx, "true", 0); !errors.Is(err, client.ErrShellNotFound) {
		t.Fatalf("unknown session: %v", err)
	}
	if err := sh.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.Status(ctx); !errors.Is(err, client.ErrShellNotFound) {
		t.Fatalf("closed session: %v", err)
	}
}

// A shell that exits ends its session with a clear answer; an explicit /bin/sh is sh.
func TestShellExitAndExplicitShell(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("shell-exit")
	ctx := context.Background()
	sh, st := must2(l.NewShell(ctx, apitype.ShellCreateRequest{Shell: "/bin/sh"}))(t)
	if st.Shell != "sh" {
		t.Fatalf("explicit /bin/sh: %+v", st)
	}
	if res := must(sh.Run(ctx, "echo ${BASH_VERSION:-none}; if then", 0))(t); res.Stdout != "" || res.ExitCode == 0 || res.Ended {
		// dash parses the whole line first: a syntax error is the command's, and nothing ran
		t.Fatalf("syntax error in sh: %+v", res)
	}
	if res := must(sh.Run(ctx, "echo ${BASH_VERSION:-none}", 0))(t); res.Stdout != "none\n" {
		t.Fatalf("sh is bash: %+v", res)
	}
	res := must(sh.Run(ctx, "echo bye; exit 3", 0))(t)
	if !res.Ended || res.ExitCode != 3 || res.Stdout != "bye\n" {
		t.Fatalf("exit 3: %+v", res)
	}
	if _, err := sh.Run(ctx, "true", 0); !errors.Is(err, client.ErrShellNotFound) {
		t.Fatalf("run after exit: %v", err)
	}
	if _, _, err := l.NewShell(ctx, apitype.ShellCreateRequest{Shell: "bin/sh"}); !errors.Is(err, client.ErrInvalidRequest) {
		t.Fatalf("relative shell: %v", err)
	}
}

// Sessions die with their lease: the shell is killed, its cgroup removed; and the lease's
// session limit is 429 lease_limit.
func TestShellDiesWithLease(t *testing.T) {
	d := startDaemon(t)
	l := d.acquire("shell-release")
	ctx := context.Background()
	var pids []string
	for range 8 {
		sh, _ := must2(l.NewShell(ctx, apitype.ShellCreateRequest{}))(t)
		pids = append(pids, strings.TrimSpace(must(sh.Run(ctx, "echo $$", 0))(t).Stdout))
	}
	if _, _, err := l.NewShell(ctx, apitype.ShellCreateRequest{}); !errors.Is(err, client.ErrLeaseLimit) {
		t.Fatalf("ninth session: %v", err)
	}
	sh := l.Shell(must(l.Shells(ctx))(t)[0].ID)
	done := make(chan error, 1)
	go func() { _, err := sh.Run(ctx, "sleep 1004.731", 0); done <- err }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if s, err := sh.Status(ctx); err == nil && s.Busy {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	<-done // answered (ended) or cut; either way it returns
	waitRetired(t, d.cfg.WorkRoot, l.ID())
	for _, pid := range pids {
		var n int
		for _, c := range pid {
			n = n*10 + int(c-'0')
		}
		if err := syscall.Kill(n, 0); !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("shell %d outlived its lease: %v", n, err)
		}
	}
	for _, line := range psLines(t) {
		if strings.Contains(line, "sleep 1004.731") {
			t.Fatalf("a session's command outlived the lease: %s", line)
		}
	}
	if isolation() == "strict" {
		if matches := daemontest.LeaseCgroups(d.cfg.CgroupParent, l.ID()); len(matches) != 0 {
			t.Fatalf("cgroups left: %v", matches)
		}
	}
	if _, err := sh.Status(ctx); !errors.Is(err, client.ErrLeaseNotFound) {
		t.Fatalf("session of a released lease: %v", err)
	}
}

func must2[A, B any](a A, b B, err error) func(*testing.T) (A, B) {
	return func(t *testing.T) (A, B) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return a, b
	}
}
