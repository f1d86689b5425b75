package process

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func sh(script string) Spec { return Spec{Argv: []string{"sh", "-c", script}} }

func TestExecExitStatus(t *testing.T) {
	m := newManager(t, Config{})
	for _, tc := range []struct {
		script string
		code   int
		signal string
	}{
		{"exit 0", 0, ""},
		{"exit 3", 3, ""},
		{"exit 255", 255, ""},
		{"kill -TERM $$", 143, "TERM"},
		{"kill -KILL $$", 137, "KILL"},
		{"kill -USR1 $$", 128 + 10, "USR1"},
	} {
		t.Run(tc.script, func(t *testing.T) {
			res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh(tc.script)})
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.code || res.Signal != tc.signal || res.TimedOut {
				t.Fatalf("got code %d signal %q timed out %v, want %d %q", res.ExitCode, res.Signal, res.TimedOut, tc.code, tc.signal)
			}
		})
	}
}

func TestExecSeparatesStdoutAndStderr(t *testing.T) {
	m := newManager(t, Config{})
	res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("echo out1; echo err1 >&2; echo out2; echo err2 >&2")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stdout != "out1\nout2\n" || res.Stderr != "err1\nerr2\n" {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
}

func TestExecCapsOutput(t *testing.T) {
	m := newManager(t, Config{MaxOutputBytes: 1000})
	for _, tc := range []struct {
		name               string
		script             string
		outLen, errLen     int
		outTrunc, errTrunc bool
	}{
		{"both over", "head -c 5000 /dev/zero; head -c 3000 /dev/zero >&2", 1000, 1000, true, true},
		{"exactly the cap", "head -c 1000 /dev/zero; head -c 999 /dev/zero >&2", 1000, 999, false, false},
		{"stderr only over", "head -c 10 /dev/zero; head -c 100000 /dev/zero >&2", 10, 1000, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh(tc.script)})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Stdout) != tc.outLen || len(res.Stderr) != tc.errLen ||
				res.StdoutTruncated != tc.outTrunc || res.StderrTruncated != tc.errTrunc {
				t.Fatalf("stdout %d (%v) stderr %d (%v)", len(res.Stdout), res.StdoutTruncated, len(res.Stderr), res.StderrTruncated)
			}
			if res.ExitCode != 0 {
				t.Fatalf("exit %d: the process must not be blocked by the cap", res.ExitCode)
			}
		})
	}
}

func TestExecTimeoutKillsGrandchildrenAndKeepsOutput(t *testing.T) {
	m := newManager(t, Config{})
	res, err := m.Exec(t.Context(), "lease", ExecRequest{
		Spec:    sh("echo started; sleep 1000 & echo $!; wait"),
		Timeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(res.Stdout)
	if !res.TimedOut || res.Signal != "KILL" || len(lines) != 2 || lines[0] != "started" {
		t.Fatalf("result %+v", res)
	}
	pid, err := strconv.Atoi(lines[1])
	if err != nil {
		t.Fatal(err)
	}
	if pidAlive(pid) {
		t.Fatalf("grandchild sleep %d survived the timeout", pid)
	}
}

func TestExecIdleTimeout(t *testing.T) {
	m := newManager(t, Config{})
	res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("echo a; sleep 1000"), IdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.Signal != "KILL" || res.Stdout != "a\n" {
		t.Fatalf("result %+v", res)
	}

	// Output keeps an idle timeout from firing even when the whole run is longer.
	res, err = m.Exec(t.Context(), "lease", ExecRequest{
		Spec:        sh("for i in 1 2 3 4 5 6 7 8 9 10; do echo $i; sleep 0.05; done"),
		IdleTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.TimedOut || res.ExitCode != 0 || len(strings.Fields(res.Stdout)) != 10 {
		t.Fatalf("result %+v", res)
	}
}

func TestExecStdin(t *testing.T) {
	m := newManager(t, Config{})
	res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: Spec{Argv: []string{"cat"}}, Stdin: strings.NewReader("hello\nworld")})
	if err != nil || res.Stdout != "hello\nworld" {
		t.Fatalf("given stdin: %q, %v", res.Stdout, err)
	}
	// Without stdin, it is empty: /dev/null, never the daemon's own.
	res, err = m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("readlink /proc/self/fd/0; cat")})
	if err != nil || res.Stdout != "/dev/null\n" {
		t.Fatalf("no stdin: %q, %v", res.Stdout, err)
	}
}

func TestExecStartErrors(t *testing.T) {
	m := newManager(t, Config{})
	for _, tc := range []struct {
		name string
		argv []string
		want []error
	}{
		{"empty argv", nil, []error{ErrInvalid}},
		{"empty argv0", []string{""}, []error{ErrInvalid}},
		{"not on PATH", []string{"no-such-command-xyz"}, []error{ErrStart, exec.ErrNotFound}},
		{"no such file", []string{"/no/such/file"}, []error{ErrStart, fs.ErrNotExist}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: Spec{Argv: tc.argv}})
			for _, want := range tc.want {
				if !errors.Is(err, want) {
					t.Fatalf("err %v, want %v", err, want)
				}
			}
		})
	}
	if _, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("true"), Timeout: -1}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative timeout: %v", err)
	}
}

func TestExecContextCancelKillsTree(t *testing.T) {
	ex := newTestExecer(t)
	m := newManager(t, Config{Execer: ex})
	ctx, cancel := context.WithCancel(t.Context())
	pidFile := filepath.Join(ex.dir, "pid")
	go func() {
		waitFor(t, "the pid file", func() bool { b, _ := os.ReadFile(pidFile); return strings.HasSuffix(string(b), "\n") })
		cancel()
	}()
	res, err := m.Exec(ctx, "lease", ExecRequest{Spec: sh("sleep 1000 & echo $! > pid; wait")})
	if !errors.Is(err, context.Canceled) || res.Signal != "KILL" || res.TimedOut {
		t.Fatalf("result %+v, err %v", res, err)
	}
	b, _ := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid == 0 || pidAlive(pid) {
		t.Fatalf("grandchild %d survived the cancel", pid)
	}
}

func TestExecTTY(t *testing.T) {
	m := newManager(t, Config{})
	// Given stdin on a TTY ends with the terminal's EOF, so cat finishes.
	res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: Spec{Argv: []string{"cat"}, TTY: true}, Stdin: strings.NewReader("hi\n")})
	if err != nil || res.Stdout != "hi\r\nhi\r\n" || res.ExitCode != 0 {
		t.Fatalf("cat on a TTY: %+v, %v", res, err)
	}

	// Without stdin the terminal's input is empty: cat ends at once.
	res, err = m.Exec(t.Context(), "lease", ExecRequest{Spec: Spec{Argv: []string{"cat"}, TTY: true}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("cat on a TTY without stdin: %+v, %v", res, err)
	}
	res, err = m.Exec(t.Context(), "lease", ExecRequest{Spec: Spec{Argv: []string{"sh", "-c", "tty; stty size; echo err >&2"}, TTY: true}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res.Stdout, "/dev/pts/") || !strings.Contains(res.Stdout, "24 80\r\n") ||
		!strings.Contains(res.Stdout, "err\r\n") || res.Stderr != "" || res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
}
