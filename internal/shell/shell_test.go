package shell

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/process"
)

// plainExecer starts real processes in their own session, in a temp workdir, with a small
// clean environment; its Tree is the process group. (The sandbox's own Execer is tested
// end to end in package sidecar.)
type plainExecer struct{ dir string }

func (e *plainExecer) Command(_ string, spec process.Spec) (*exec.Cmd, process.Tree, error) {
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + e.dir, "LANG=C"}
	for k, v := range spec.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = filepath.Join(e.dir, spec.Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd, &groupTree{cmd: cmd}, nil
}

type groupTree struct{ cmd *exec.Cmd }

func (g *groupTree) Start() error    { return g.cmd.Start() }
func (g *groupTree) OOMKilled() bool { return false }
func (g *groupTree) Close() error    { return g.Kill() }
func (g *groupTree) Signal(sig syscall.Signal) error {
	if g.cmd.Process == nil {
		return nil
	}
	if err := syscall.Kill(-g.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}
func (g *groupTree) Kill() error { return g.Signal(syscall.SIGKILL) }

type fixture struct {
	dir   string
	procs *process.Manager
	m     *Manager
}

func newFixture(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	return newFixtureWith(t, process.Config{}, mod)
}

// newFixtureWith takes the process layer's config too (its Execer is set here).
func newFixtureWith(t *testing.T, pcfg process.Config, mod func(*Config)) *fixture {
	t.Helper()
	dir := t.TempDir()
	pcfg.Execer = &plainExecer{dir: dir}
	procs, err := process.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Processes: procs, InterruptGrace: 500 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.ReleaseLease("l1")
		procs.ReleaseLease("l1")
	})
	return &fixture{dir: dir, procs: procs, m: m}
}

func (f *fixture) create(t *testing.T, shell string) *Session {
	t.Helper()
	s, err := f.m.Create(context.Background(), "l1", CreateRequest{Shell: shell})
	if err != nil {
		t.Fatalf("create %q: %v", shell, err)
	}
	return s
}

func run(t *testing.T, s *Session, cmd string, timeout time.Duration) Result {
	t.Helper()
	res, err := s.Run(context.Background(), RunRequest{Command: cmd, Timeout: timeout})
	if err != nil {
		t.Fatalf("run %q: %v", cmd, err)
	}
	return res
}

// shells is every shell a session may run here: auto (bash), and dash as /bin/sh.
var shells = []string{"", "/bin/sh"}

func TestStateCarriesOver(t *testing.T) {
	for _, sh := range shells {
		t.Run("shell="+sh, func(t *testing.T) {
			f := newFixture(t, nil)
			s := f.create(t, sh)
			if err := os.Mkdir(filepath.Join(f.dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			first := run(t, s, "pwd", 0)
			home := strings.TrimSuffix(first.Stdout, "\n")
			if res := run(t, s, "cd sub && export A=1", 0); res.ExitCode != 0 || res.Cwd != home+"/sub" {
				t.Fatalf("cd: %+v", res)
			}
			res := run(t, s, "pwd; echo $A", 0)
			if want := home + "/sub\n1\n"; res.Stdout != want || res.ExitCode != 0 {
				t.Fatalf("got %+v, want stdout %q", res, want)
			}
			st := s.Status()
			if st.Cwd != home+"/sub" || st.Commands != 3 || st.LastExitCode == nil || *st.LastExitCode != 0 || st.Busy {
				t.Fatalf("status %+v", st)
			}
			want := "bash"
			if sh != "" {
				want = "sh"
			}
			if st.Shell != want {
				t.Fatalf("shell %q, want %q", st.Shell, want)
			}
		})
	}
}

func TestExitCodesAndStreams(t *testing.T) {
	for _, sh := range shells {
		t.Run("shell="+sh, func(t *testing.T) {
			f := newFixture(t, nil)
			s := f.create(t, sh)
			res := run(t, s, "echo out; echo err >&2; (exit 7)", 0)
			if res.ExitCode != 7 || res.Stdout != "out\n" || res.Stderr != "err\n" || res.Ended {
				t.Fatalf("%+v", res)
			}
			// A syntax error is the command's failure, not the shell's end.
			res = run(t, s, "if then fi (", 0)
			if res.ExitCode == 0 || res.Ended || res.Stderr == "" {
				t.Fatalf("syntax error: %+v", res)
			}
			if res := run(t, s, "echo still", 0); res.Stdout != "still\n" {
				t.Fatalf("after syntax error: %+v", res)
			}
		})
	}
}

func TestFramingIsExact(t *testing.T) {
	for _, sh := range shells {
		t.Run("shell="+sh, func(t *testing.T) {
			f := newFixture(t, nil)
			s := f.create(t, sh)
			// Text without a trailing newline, a line that looks like a marker, single
			// quotes, bytes of every value from 1 to 255 but the marker's alphabet.
			cases := map[string]string{
				"printf 'no newline'":                    "no newline",
				"printf 'SCFAKE0:/:SCFAKE\\n'; printf x": "SCFAKE0:/:SCFAKE\nx",
				`echo "it's"`:                            "it's\n",
				"printf '\\001\\002\\377\\n\\n'":         "\x01\x02\xff\n\n",
				"printf ''":                              "",
			}
			for cmd, want := range cases {
				if res := run(t, s, cmd, 0); res.Stdout != want || res.ExitCode != 0 {
					t.Errorf("%q: stdout %q, want %q (%+v)", cmd, res.Stdout, want, res)
				}
			}
			// A multi-line command with a here-document.
			res := run(t, s, "cat <<'EOF'\na 'b' \"c\"\nEOF\necho done", 0)
			if res.Stdout != "a 'b' \"c\"\ndone\n" {
				t.Fatalf("heredoc: %q", res.Stdout)
			}
			// Redirecting the shell's own stdout does not swallow the framing.
			res = run(t, s, "exec >/dev/null; echo hidden", 0)
			if res.Stdout != "" || res.Ended {
				t.Fatalf("exec >/dev/null: %+v", res)
			}
			if res := run(t, s, "exec >&8; echo back", 0); res.Stdout != "back\n" {
				t.Fatalf("after restoring stdout: %+v", res)
			}
		})
	}
}

func TestStdinReadersReturn(t *testing.T) {
	for _, sh := range shells {
		t.Run("shell="+sh, func(t *testing.T) {
			f := newFixture(t, nil)
			s := f.create(t, sh)
			res := run(t, s, "cat; read x; echo \"read=$? x=[$x]\"", 20*time.Second)
			if res.TimedOut || res.Stdout != "read=1 x=[]\n" {
				t.Fatalf("%+v", res)
			}
			if res := run(t, s, "echo next", 0); res.Stdout != "next\n" {
				t.Fatalf("after stdin readers: %+v", res)
			}
		})
	}
}

func TestTimeoutInterruptsCommandNotShell(t *testing.T) {
	for _, sh := range shells {
		t.Run("shell="+sh, func(t *testing.T) {
			f := newFixture(t, nil)
			s := f.create(t, sh)
			run(t, s, "export KEEP=yes; sleep 300 & echo $! > bg.pid", 0)
			res := run(t, s, "echo before; sleep 100", 300*time.Millisecond)
			if !res.TimedOut || res.Ended || res.Stdout != "before\n" || res.ExitCode == 0 {
				t.Fatalf("sleep: %+v", res)
			}
			// A command that ignores SIGINT is killed, and the shell stays.
			res = run(t, s, "(trap '' INT; sleep 100)", 300*time.Millisecond)
			if !res.TimedOut || res.Ended {
				t.Fatalf("INT-ignoring command: %+v", res)
			}
			res = run(t, s, "echo $KEEP; kill -0 $(cat bg.pid) && echo bg-alive", 0)
			if res.Stdout != "yes\nbg-alive\n" {
				t.Fatalf("after timeouts: %+v", res)
			}
		})
	}
}

func TestShellExitEndsSession(t *testing.T) {
	f := newFixture(t, nil)
	s := f.create(t, "")
	res := run(t, s, "echo bye; exit 3", 0)
	if !res.Ended || res.ExitCode != 3 || res.Stdout != "bye\n" {
		t.Fatalf("%+v", res)
	}
	if _, err := s.Run(context.Background(), RunRequest{Command: "true"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("run after exit: %v", err)
	}
	if _, err := f.m.Get("l1", s.ID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after exit: %v", err)
	}
}

func TestBusyAndLimits(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxSessions = 2; c.MaxCommandBytes = 100 })
	s := f.create(t, "")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		run(t, s, "sleep 100", 500*time.Millisecond)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !s.Status().Busy && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := s.Run(context.Background(), RunRequest{Command: "true"}); !errors.Is(err, ErrBusy) {
		t.Fatalf("concurrent run: %v", err)
	}
	wg.Wait()
	for _, cmd := range []string{"", strings.Repeat("x", 101), "a\x00b"} {
		if _, err := s.Run(context.Background(), RunRequest{Command: cmd}); !errors.Is(err, ErrInvalid) {
			t.Errorf("command %q: %v", cmd, err)
		}
	}
	f.create(t, "")
	if _, err := f.m.Create(context.Background(), "l1", CreateRequest{}); !errors.Is(err, ErrLimit) {
		t.Fatalf("third session: %v", err)
	}
	if got := len(f.m.List("l1")); got != 2 {
		t.Fatalf("listed %d sessions", got)
	}
	for _, bad := range []string{"sh", "/" + strings.Repeat("x", MaxShellPath)} {
		if _, err := f.m.Create(context.Background(), "l2", CreateRequest{Shell: bad}); !errors.Is(err, ErrInvalid) {
			t.Errorf("shell %q: %v", bad, err)
		}
	}
	if _, err := f.m.Create(context.Background(), "l2", CreateRequest{Shell: "/bin/true"}); !errors.Is(err, ErrNotReady) {
		t.Errorf("shell /bin/true: %v", err)
	}
}

func TestCloseAndRelease(t *testing.T) {
	f := newFixture(t, nil)
	a, b := f.create(t, ""), f.create(t, "")
	pidOf := func(s *Session) int { return s.pid }
	if err := f.m.Close("l1", a.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.m.Get("l1", a.ID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("closed session: %v", err)
	}
	if err := syscall.Kill(pidOf(a), 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("closed shell %d still there: %v", pidOf(a), err)
	}
	// A release ends the session that is running a command; its Run says so.
	done := make(chan Result, 1)
	go func() {
		res, _ := b.Run(context.Background(), RunRequest{Command: "sleep 100"})
		done <- res
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !b.Status().Busy && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	f.m.ReleaseLease("l1")
	if res := <-done; !res.Ended {
		t.Fatalf("run during release: %+v", res)
	}
	if n := len(f.m.List("l1")); n != 0 {
		t.Fatalf("%d sessions after release", n)
	}
	if err := syscall.Kill(pidOf(b), 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("released shell still there: %v", err)
	}
}

func TestContextEndInterrupts(t *testing.T) {
	f := newFixture(t, nil)
	s := f.create(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := s.Run(ctx, RunRequest{Command: "sleep 100"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("run: %v", err)
	}
	if res := run(t, s, "echo ok", 0); res.Stdout != "ok\n" {
		t.Fatalf("after a canceled run: %+v", res)
	}
}

// A command's output over the cap keeps its head and its end, as an exec's, split as
// output_head_bytes says, and counts what it dropped.
func TestLargeOutputTruncated(t *testing.T) {
	f := newFixtureWith(t, process.Config{MaxOutputBytes: 1000}, nil)
	s := f.create(t, "")
	const big = "echo first; head -c 200000 /dev/zero | tr '\\0' a; echo; echo last; echo tail >&2"
	const total int64 = int64(len("first\n") + 200000 + 1 + len("last\n"))
	res := run(t, s, big, 0)
	want := "first\n" + strings.Repeat("a", 494) + strings.Repeat("a", 494) + "\nlast\n"
	if !res.StdoutTruncated || res.Stdout != want || res.StdoutDropped != total-1000 || res.StdoutDroppedAt != 500 ||
		res.Stderr != "tail\n" || res.StderrDropped != 0 {
		t.Fatalf("stdout %d bytes truncated=%v dropped %d at %d, stderr %q", len(res.Stdout), res.StdoutTruncated,
			res.StdoutDropped, res.StdoutDroppedAt, res.Stderr)
	}
	head := int64(100)
	res, err := s.Run(context.Background(), RunRequest{Command: big, OutputHeadBytes: &head})
	if err != nil || res.Stdout[:100] != want[:100] || !strings.HasSuffix(res.Stdout, "a\nlast\n") || len(res.Stdout) != 1000 ||
		res.StdoutDroppedAt != 100 {
		t.Fatalf("head of 100: %v, dropped at %d, %d bytes", err, res.StdoutDroppedAt, len(res.Stdout))
	}
	head = 1001
	if _, err := s.Run(context.Background(), RunRequest{Command: "true", OutputHeadBytes: &head}); !errors.Is(err, process.ErrInvalid) {
		t.Fatalf("head over the cap: %v, want process.ErrInvalid", err)
	}
	if res := run(t, s, "echo small", 0); res.Stdout != "small\n" || res.StdoutTruncated {
		t.Fatalf("next: %+v", res)
	}
}

// A command's output is within the daemon's output budget, as an exec's: while another
// capture holds most of it, the command keeps its first 4 KiB per stream and what is left,
// flagged truncated (the command still ends normally); its share is held until its reply
// is written, and the whole budget is back after the run.
func TestOutputBudget(t *testing.T) {
	const limit, budget, first = 64 << 10, 16 << 10, 4 << 10 // first: outside the budget
	f := newFixtureWith(t, process.Config{MaxOutputBytes: limit, OutputBudgetBytes: budget}, nil)
	s := f.create(t, "")
	kept := func(n int) (int, bool) { // what a new capture keeps of n bytes, released
		c := mustCapture(t, f.procs)
		defer c.Release()
		c.Write(apitype.ChannelStdout, make([]byte, n))
		out, truncated := c.Output(apitype.ChannelStdout)
		return len(out), truncated
	}

	const held = 10 << 10
	hold := mustCapture(t, f.procs) // another request's output: first + held
	hold.Write(apitype.ChannelStdout, make([]byte, first+held))
	if out, truncated := hold.Output(apitype.ChannelStdout); len(out) != first+held || truncated {
		t.Fatalf("holding capture kept %d bytes, truncated %v", len(out), truncated)
	}
	const big = "head -c 100000 /dev/zero | tr '\\0' a; echo tail >&2"
	replied := false
	res, err := s.Run(context.Background(), RunRequest{Command: big, Reply: func(res Result) error {
		replied = true
		if want := first + budget - held; len(res.Stdout) != want || res.Stdout != strings.Repeat("a", want) || !res.StdoutTruncated {
			t.Errorf("stdout beside a held budget: %d bytes, truncated %v; want %d, truncated", len(res.Stdout), res.StdoutTruncated, want)
		}
		if res.Stderr != "tail\n" || res.StderrTruncated || res.ExitCode != 0 || res.Ended {
			t.Errorf("result beside a held budget: %+v", res)
		}
		// Until the reply is written, the command holds the rest: the budget is spent.
		if n, truncated := kept(first + 1); n != first || !truncated {
			t.Errorf("capture while the reply holds the budget kept %d bytes, truncated %v; want %d, truncated", n, truncated, first)
		}
		return nil
	}})
	if err != nil || !replied {
		t.Fatalf("run: %v, replied %v", err, replied)
	}
	if res.ExitCode != 0 || !res.StdoutTruncated {
		t.Fatalf("run result: %+v", res)
	}
	hold.Release()
	if n, truncated := kept(first + budget + 1); n != first+budget || !truncated {
		t.Fatalf("after the run and the release, a capture kept %d bytes (truncated %v); want the whole budget %d", n, truncated, first+budget)
	}
	// With the budget back, a command gets all of it.
	res = run(t, s, big, 0)
	if len(res.Stdout) != first+budget || !res.StdoutTruncated || res.Stderr != "tail\n" {
		t.Fatalf("run with the budget back: %d bytes, truncated %v, stderr %q; want %d", len(res.Stdout), res.StdoutTruncated, res.Stderr, first+budget)
	}
	if n, _ := kept(first + budget + 1); n != first+budget {
		t.Fatalf("after the second run a capture kept %d bytes; want the whole budget %d", n, first+budget)
	}
}

func TestStreamSplitMarker(t *testing.T) {
	// The marker split at every position across two chunks still ends the stream, and
	// the output before it is exact.
	const n = "SCABCDEFGH"
	procs, err := process.New(process.Config{Execer: &plainExecer{dir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i <= len(n); i++ {
		capture := mustCapture(t, procs)
		st := newStream(n, capture, apitype.ChannelStdout)
		data := "out" + n + "0:/x" + n
		cut := 3 + i
		st.feed([]byte(data[:cut]))
		st.feed([]byte(data[cut:]))
		out, _ := capture.Output(apitype.ChannelStdout)
		if !st.done || out != "out" || string(st.trailer) != "0:/x" {
			t.Fatalf("cut %d: done=%v out=%q trailer=%q", cut, st.done, out, st.trailer)
		}
		capture.Release()
	}
}

// Both ways of finding a shell's descendants agree, on a real tree of three levels.
func TestDescendants(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "sh -c 'sleep 100 & sleep 100; :' & sleep 100; :")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	root := cmd.Process.Pid
	deadline := time.Now().Add(10 * time.Second)
	var got map[int]bool
	for time.Now().Before(deadline) {
		if got = descendants(root); len(got) == 4 { // sh, sleep; under sh: two sleeps
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	scan := descendantsByScan(root)
	if len(got) != 4 || len(scan) != 4 {
		t.Fatalf("descendants %v, by scan %v; want 4 each", got, scan)
	}
	for pid := range got {
		if !scan[pid] {
			t.Fatalf("descendants %v, by scan %v", got, scan)
		}
	}
	defer func() {
		for pid := range got {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}()
}

// mustCapture is a Capture with the default split.
func mustCapture(t *testing.T, procs *process.Manager) *process.Capture {
	t.Helper()
	c, err := procs.NewCapture(nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
