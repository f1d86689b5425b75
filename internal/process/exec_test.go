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

// A lease runs at most MaxExecs at once, counted until each reply is written; other
// leases are not affected, and a slot frees once its reply is done.
func TestExecLimitPerLease(t *testing.T) {
	m := newManager(t, Config{MaxExecs: 2}, "other")
	replying := make(chan struct{}, 2)
	hold := make(chan struct{})
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := m.Exec(context.Background(), "lease", ExecRequest{Spec: sh("true"), Reply: func(ExecResult) error {
				replying <- struct{}{}
				<-hold
				return nil
			}})
			errs <- err
		}()
	}
	<-replying
	<-replying
	if _, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("echo never")}); !errors.Is(err, ErrExecLimit) {
		t.Fatalf("third exec of a lease with two replying: %v, want ErrExecLimit", err)
	}
	if res, err := m.Exec(t.Context(), "other", ExecRequest{Spec: sh("echo ok")}); err != nil || res.Stdout != "ok\n" {
		t.Fatalf("another lease's exec: %+v %v", res, err)
	}
	close(hold)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("echo again")}); err != nil || res.Stdout != "again\n" {
		t.Fatalf("exec after the slots freed: %+v %v", res, err)
	}
}

// Output that Execs hold is bounded daemon-wide: while one exec's reply holds its output,
// another gets what is left of the budget, flagged truncated (the process is never held
// back), small output still arrives whole, and once the reply is written the whole
// budget is back.
func TestExecOutputBudget(t *testing.T) {
	const limit, budget = 100 << 10, 150 << 10
	m := newManager(t, Config{MaxOutputBytes: limit, OutputBudgetBytes: budget})
	replying := make(chan struct{})
	hold := make(chan struct{})
	first := make(chan ExecResult, 1)
	go func() {
		res, err := m.Exec(context.Background(), "lease", ExecRequest{Spec: sh("head -c 200000 /dev/zero"), Reply: func(ExecResult) error {
			close(replying)
			<-hold
			return nil
		}})
		if err != nil {
			t.Error(err)
		}
		first <- res
	}()
	<-replying
	res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("head -c 200000 /dev/zero; echo done >&2")})
	if err != nil {
		t.Fatal(err)
	}
	// The first minCapture bytes of each stream are outside the budget.
	if want := budget - (limit - minCapture) + minCapture; len(res.Stdout) != want || !res.StdoutTruncated || res.ExitCode != 0 {
		t.Fatalf("exec beside a held reply: %d bytes of stdout (truncated %v, exit %d), want %d truncated, exit 0",
			len(res.Stdout), res.StdoutTruncated, res.ExitCode, want)
	}
	if free, want := m.output.free.Load(), int64(budget-(limit-minCapture)); free != want {
		t.Fatalf("budget while one reply holds it: %d free, want %d", free, want)
	}
	// Small output arrives whole even with the budget spent.
	if res.Stderr != "done\n" || res.StderrTruncated {
		t.Fatalf("small stderr beside a spent budget: %q truncated %v, want it whole", res.Stderr, res.StderrTruncated)
	}
	close(hold)
	if r := <-first; len(r.Stdout) != limit || !r.StdoutTruncated {
		t.Fatalf("held exec: %d bytes (truncated %v), want %d truncated", len(r.Stdout), r.StdoutTruncated, limit)
	}
	if free := m.output.free.Load(); free != budget {
		t.Fatalf("budget after every exec replied: %d free of %d", free, budget)
	}
	if res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("head -c 200000 /dev/zero")}); err != nil || len(res.Stdout) != limit {
		t.Fatalf("exec with the budget back: %d bytes, %v; want %d", len(res.Stdout), err, limit)
	}
}

// A run's output over the cap comes back as its head and its end, the dropped bytes
// counted exactly: a test suite's first line and its summary both arrive.
func TestExecKeepsHeadAndTail(t *testing.T) {
	m := newManager(t, Config{}) // 1 MiB per stream
	// 3 MiB between a first and a last line that appear nowhere else.
	script := `echo FIRST-LINE; head -c 3145728 /dev/zero | tr '\0' x; echo; echo LAST-LINE`
	const total int64 = int64(len("FIRST-LINE\n") + 3<<20 + 1 + len("LAST-LINE\n"))
	half := int64(DefaultMaxOutputBytes / 2)
	for _, tc := range []struct {
		name       string
		head       *int64
		first, end bool // kept
		at         int64
	}{
		{"default half and half", nil, true, true, half},
		{"tail only", new(int64), false, true, 0},
		{"head only", ptr(int64(DefaultMaxOutputBytes)), true, false, DefaultMaxOutputBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh(script), OutputHeadBytes: tc.head})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Stdout) != DefaultMaxOutputBytes || res.StdoutDropped != total-DefaultMaxOutputBytes ||
				res.StdoutDroppedAt != tc.at || !res.StdoutTruncated || res.ExitCode != 0 {
				t.Fatalf("kept %d bytes, dropped %d at %d (truncated %v, exit %d); want %d, %d at %d",
					len(res.Stdout), res.StdoutDropped, res.StdoutDroppedAt, res.StdoutTruncated, res.ExitCode,
					DefaultMaxOutputBytes, total-DefaultMaxOutputBytes, tc.at)
			}
			first, end := strings.HasPrefix(res.Stdout, "FIRST-LINE\n"), strings.HasSuffix(res.Stdout, "\nLAST-LINE\n")
			if first != tc.first || end != tc.end {
				t.Fatalf("first line kept %v, last line kept %v; want %v, %v", first, end, tc.first, tc.end)
			}
		})
	}
	if _, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("true"), OutputHeadBytes: ptr(int64(-1))}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a negative head: %v, want ErrInvalid", err)
	}
}

func ptr[T any](v T) *T { return &v }
