package process

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// helperEnv makes the test binary act as a small helper program instead of running
// tests (see TestMain).
const helperEnv = "SIDECAR_PROCESS_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "winch":
		winchHelper()
	default:
		os.Exit(2)
	}
}

// winchHelper prints "ready", then "winch ROWS COLS" for every SIGWINCH, until stdin
// ends.
func winchHelper() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGWINCH)
	fmt.Println("ready")
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(eof) }()
	for {
		select {
		case <-sigs:
			ws, err := unix.IoctlGetWinsize(0, unix.TIOCGWINSZ)
			if err != nil {
				fmt.Println("winch error", err)
				continue
			}
			fmt.Printf("winch %d %d\n", ws.Row, ws.Col)
		case <-eof:
			os.Exit(0)
		}
	}
}

// helperSpec runs the test binary as the named helper.
func helperSpec(t *testing.T, name string, tty bool) Spec {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Spec{Argv: []string{self}, Env: map[string]string{helperEnv: name}, TTY: tty}
}

// testExecer makes plain processes in their own session, in a temp workdir, with a
// clean environment. Its Tree is the process group, which Close leaves running, as the
// sandbox leaves a command's leftovers in the lease; the test's end kills them.
type testExecer struct {
	dir   string
	mu    sync.Mutex
	trees []*groupTree
}

func newTestExecer(t testing.TB) *testExecer {
	e := &testExecer{dir: t.TempDir()}
	t.Cleanup(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, g := range e.trees {
			if pgid := g.pgid(); pgid != 0 && groupAlive(pgid) {
				_ = g.Kill()
			}
		}
	})
	return e
}

func (e *testExecer) Command(leaseID string, spec Spec) (*exec.Cmd, Tree, error) {
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + e.dir, "LANG=C", "TERM=xterm"}
	for k, v := range spec.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = filepath.Join(e.dir, spec.Dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	g := &groupTree{cmd: cmd}
	e.mu.Lock()
	e.trees = append(e.trees, g)
	e.mu.Unlock()
	return cmd, g, nil
}

// groupTree is a command's process group (its session leader's pid).
type groupTree struct{ cmd *exec.Cmd }

func (g *groupTree) pgid() int {
	if g.cmd.Process == nil {
		return 0
	}
	return g.cmd.Process.Pid
}

func (g *groupTree) Kill() error {
	pgid := g.pgid()
	if pgid == 0 {
		return nil
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for groupAlive(pgid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("process group %d still alive", pgid)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

func (g *groupTree) Signal(sig syscall.Signal) error {
	if pgid := g.pgid(); pgid != 0 {
		return syscall.Kill(-pgid, sig)
	}
	return nil
}

func (g *groupTree) Start() error    { return g.cmd.Start() }
func (g *groupTree) OOMKilled() bool { return false }
func (g *groupTree) Close() error    { return nil } // leftovers stay (until the test ends)

// procStat reads state and process group of pid from /proc; ok is false once the pid
// is gone.
func procStat(pid int) (state byte, pgrp int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 3 {
		return 0, 0, false
	}
	pgrp, _ = strconv.Atoi(f[2])
	return f[0][0], pgrp, true
}

// pidAlive: a zombie is dead (pid 1 here may not reap orphans promptly).
func pidAlive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != 'Z'
}

func groupAlive(pgid int) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, pgrp, ok := procStat(pid); ok && pgrp == pgid && state != 'Z' {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testtool.WaitFor(t, what, 10*time.Second, cond)
}

// newManager makes a Manager with the test Execer; the test releases "lease" (and any
// other lease it names) at cleanup.
func newManager(t testing.TB, cfg Config, leases ...string) *Manager {
	t.Helper()
	if cfg.Execer == nil {
		cfg.Execer = newTestExecer(t)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, l := range append(leases, "lease") {
			m.ReleaseLease(l)
		}
	})
	return m
}

// readAll reads a subscription to io.EOF.
func readAll(t testing.TB, s *Subscription) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var buf bytes.Buffer
	for {
		c, err := s.Next(ctx)
		if errors.Is(err, io.EOF) {
			return buf.Bytes()
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		buf.Write(c.Data)
	}
}

// readUntil reads a subscription until the output so far contains want.
func readUntil(t *testing.T, s *Subscription, out *bytes.Buffer, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for !strings.Contains(out.String(), want) {
		c, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %q, got %q: %v", want, out.String(), err)
		}
		out.Write(c.Data)
	}
}

func waitDone(t *testing.T, p *Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("process %s did not end", p.ID())
	}
}

// seqOutput is what `seq 1 n` prints.
func seqOutput(n int) []byte {
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	for i := 1; i <= n; i++ {
		w.WriteString(strconv.Itoa(i))
		w.WriteByte('\n')
	}
	w.Flush()
	return b.Bytes()
}
