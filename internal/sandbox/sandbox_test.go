package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sidecar-sandbox/sidecar/internal/confine"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

func TestCleanProcess(t *testing.T) { forEachHelper(t, testCleanProcess) }

func testCleanProcess(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	os.Setenv("SIDECAR_AUTH_TOKEN", "secret-must-not-leak")
	defer os.Unsetenv("SIDECAR_AUTH_TOKEN")

	r := run(t, s, l.ID, Spec{Argv: []string{"env"}, Env: map[string]string{"FOO": "bar"}})
	got := lines(r.stdout)
	want := []string{"FOO=bar", "HOME=/workspace", "LANG=C.UTF-8", "LOGNAME=user",
		"PATH=" + DefaultPath, "SHELL=" + s.shell, "TMPDIR=/tmp", "USER=user"}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("env = %q, want %q", got, want)
	}

	r = run(t, s, l.ID, Spec{Argv: []string{"ls", "/proc/self/fd"}})
	if fds := lines(r.stdout); !slices.Equal(fds, []string{"0", "1", "2", "3"}) { // 3: ls's own directory
		t.Errorf("/proc/self/fd = %q, want 0-2 and ls's own", fds)
	}

	r = run(t, s, l.ID, sh(`id -u; id -g; id -G; pwd; read -r _ _ _ _ pgid sid _ < /proc/$$/stat; echo $sid $pgid; echo $$; grep NoNewPrivs /proc/self/status`))
	out := lines(r.stdout)
	id := strconv.Itoa(l.UID)
	if len(out) < 6 || out[0] != id || out[1] != id || out[2] != id || out[3] != Workspace {
		t.Fatalf("id/pwd = %q", out)
	}
	if f := strings.Fields(out[4]); len(f) != 2 || f[0] != f[1] {
		t.Errorf("session/process group = %q, want own session and group", out[4])
	}
	if !strings.HasSuffix(out[len(out)-1], "1") {
		t.Errorf("no_new_privs not set: %q", out[len(out)-1])
	}
	for _, d := range []string{l.Workdir, l.TmpDir} {
		st, _ := os.Stat(d)
		sys := st.Sys().(*syscall.Stat_t)
		if int(sys.Uid) != l.UID || st.Mode().Perm() != 0o700 {
			t.Errorf("%s owned by %d mode %o, want %d 0700", d, sys.Uid, st.Mode().Perm(), l.UID)
		}
	}
}

func TestCwdAndBadInput(t *testing.T) { forEachHelper(t, testCwdAndBadInput) }

func testCwdAndBadInput(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	os.Mkdir(filepath.Join(l.Workdir, "sub"), 0o755)
	os.Symlink("/etc", filepath.Join(l.Workdir, "escape"))
	os.WriteFile(filepath.Join(l.Workdir, "file"), nil, 0o644)

	for _, dir := range []string{"sub", "/workspace/sub", "./sub/", "/workspace//sub/."} {
		r := run(t, s, l.ID, Spec{Argv: []string{"/bin/sh", "-c", "pwd; /bin/pwd -P"}, Dir: dir})
		if got := lines(r.stdout); !slices.Equal(got, []string{"/workspace/sub", "/workspace/sub"}) {
			t.Errorf("cwd %q: pwd = %q %s", dir, got, r.stderr)
		}
	}
	for _, dir := range []string{"", ".", "/workspace", "/workspace/"} {
		r := run(t, s, l.ID, Spec{Argv: []string{"/bin/pwd"}, Dir: dir})
		if got := strings.TrimSpace(r.stdout); got != Workspace {
			t.Errorf("cwd %q: pwd = %q %s", dir, got, r.stderr)
		}
	}
	for _, tc := range []struct {
		name  string
		lease string
		spec  Spec
		want  error
	}{
		{"unknown lease", "nope", sh("true"), ErrUnknownLease},
		{"dotdot", l.ID, Spec{Argv: []string{"true"}, Dir: "../"}, ErrOutsideWorkdir},
		{"absolute", l.ID, Spec{Argv: []string{"true"}, Dir: "/etc"}, ErrOutsideWorkdir},
		{"host path", l.ID, Spec{Argv: []string{"true"}, Dir: l.Workdir}, ErrOutsideWorkdir},
		{"out of /workspace", l.ID, Spec{Argv: []string{"true"}, Dir: "/workspace/../etc"}, ErrOutsideWorkdir},
		{"/workspaces", l.ID, Spec{Argv: []string{"true"}, Dir: "/workspaces"}, ErrOutsideWorkdir},
		{"symlink out", l.ID, Spec{Argv: []string{"true"}, Dir: "escape"}, ErrOutsideWorkdir},
		{"not a dir", l.ID, Spec{Argv: []string{"true"}, Dir: "file"}, ErrInvalid},
		{"missing dir", l.ID, Spec{Argv: []string{"true"}, Dir: "nope"}, ErrInvalid},
		{"empty argv", l.ID, Spec{}, ErrInvalid},
		{"empty argv0", l.ID, Spec{Argv: []string{""}}, ErrInvalid},
		{"nul in arg", l.ID, Spec{Argv: []string{"echo", "a\x00b"}}, ErrInvalid},
		{"env key =", l.ID, Spec{Argv: []string{"true"}, Env: map[string]string{"A=B": "c"}}, ErrInvalid},
		{"env key empty", l.ID, Spec{Argv: []string{"true"}, Env: map[string]string{"": "c"}}, ErrInvalid},
		{"env nul", l.ID, Spec{Argv: []string{"true"}, Env: map[string]string{"A": "\x00"}}, ErrInvalid},
		{"not found", l.ID, Spec{Argv: []string{"no-such-program-xyz"}}, exec.ErrNotFound},
		{"not reachable", l.ID, Spec{Argv: []string{os.Args[0]}}, exec.ErrNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.settle()
			before, _ := os.ReadDir(cgroupDir(s, "freezer", l.ID))
			cmd, tr, err := s.Command(tc.lease, tc.spec)
			if !errors.Is(err, tc.want) || cmd != nil || tr != nil {
				t.Fatalf("Command = %v, %v, want %v", cmd, err, tc.want)
			}
			after, _ := os.ReadDir(cgroupDir(s, "freezer", l.ID))
			if len(after) != len(before) {
				t.Errorf("a failed Command left cgroup state behind")
			}
		})
	}
	for _, bad := range []func(*LeaseSpec){
		func(l *LeaseSpec) { l.ID = "../x" },
		func(l *LeaseSpec) { l.Workdir = "relative" },
		func(l *LeaseSpec) { l.UID = 0 },
	} {
		spec := l
		bad(&spec)
		if err := s.Provision(context.Background(), spec); !errors.Is(err, ErrInvalid) {
			t.Errorf("Provision(%+v) = %v, want ErrInvalid", spec, err)
		}
	}
}

// An executable that vanishes between Command's check and the exec is the target's exit
// status, 127, as in a shell: not a sandbox setup failure.
func TestExecNotFoundIsExitStatus(t *testing.T) { forEachHelper(t, testExecNotFoundIsExitStatus) }

func testExecNotFoundIsExitStatus(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	exe := filepath.Join(l.Workdir, "gone")
	os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755)
	cmd, tr, err := s.Command(l.ID, Spec{Argv: []string{"./gone"}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	os.Remove(exe) // vanishes between the check and the exec
	if err := tr.Start(); err != nil {
		t.Fatalf("Start = %v, want the exec failure as the exit status", err)
	}
	if cmd.Wait(); cmd.ProcessState.ExitCode() != 127 {
		t.Fatalf("exit %d, want 127", cmd.ProcessState.ExitCode())
	}
}

// A process that forks at once, many times, is in its command's cgroup from its first
// instruction: every child reports the root of its cgroup namespace in every controller
// used, and that root is the command's child cgroup (TestLeaseCgroupView,
// TestLauncherRunsTheNextCommand): a process anywhere else would see a path.
func TestInCgroupFromFirstInstruction(t *testing.T) {
	forEachHelper(t, testInCgroupFromFirstInstruction)
}

func testInCgroupFromFirstInstruction(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	v2 := s.cg.Version() == "v2"
	perProcess := 4 // v1: memory, cpu+cpuacct, pids, freezer; v2: the one line
	if v2 {
		perProcess = 1
	}
	runs := 50
	if testing.Short() { // the VM tests (test/vm), under software emulation
		runs = 5
	}
	for i := range runs {
		r := run(t, s, l.ID, sh(`for i in 1 2 3 4 5; do cat /proc/self/cgroup & done; wait`))
		n := 0
		for _, line := range lines(r.stdout) {
			f := strings.SplitN(line, ":", 3)
			ctrl := f[1]
			if v2 {
				if line[:3] != "0::" {
					continue
				}
			} else if !slices.ContainsFunc(strings.Split(ctrl, ","), func(c string) bool { return slices.Contains(v1Controllers, c) }) {
				continue
			}
			n++
			if f[2] != "/" {
				t.Fatalf("run %d: %q not in the command's child cgroup, its cgroup namespace's root", i, line)
			}
		}
		if n < 5*perProcess {
			t.Fatalf("run %d: only %d cgroup lines:\n%s%s", i, n, r.stdout, r.stderr)
		}
	}
}

func TestLeasesAreIsolated(t *testing.T) { forEachHelper(t, testLeasesAreIsolated) }

// worldWritable are the probes that only Landlock stops: host directories anyone may write.
var worldWritable = map[string]bool{"write /var/tmp": true, "write /dev/shm": true}

func testLeasesAreIsolated(t *testing.T, s *Sandbox) {
	a := newTestLease(t, s, nil)
	b := newTestLease(t, s, nil)
	os.WriteFile(filepath.Join(b.Workdir, "secret"), []byte("b"), 0o644)
	run(t, s, b.ID, sh(`echo b > /tmp/b-was-here`))

	// B runs a process for A to try to signal.
	bcmd, btree, err := s.Command(b.ID, Spec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	defer btree.Close()
	if err := btree.Start(); err != nil {
		t.Fatal(err)
	}

	daemon := os.Getpid()
	for _, tc := range []struct{ name, script string }{
		{"list B's workdir", "ls " + b.Workdir},
		{"read B's file", "cat " + b.Workdir + "/secret"},
		{"read B's file via /proc", fmt.Sprintf("cat /proc/%d/root%s/secret", bcmd.Process.Pid, b.Workdir)},
		{"list B's tmp dir", "ls " + b.TmpDir},
		{"see B's /tmp", "test -e /tmp/b-was-here"},
		{"signal B", fmt.Sprintf("kill -0 %d", bcmd.Process.Pid)},
		{"signal the daemon", fmt.Sprintf("kill -0 %d", daemon)},
		{"daemon environ", fmt.Sprintf("cat /proc/%d/environ", daemon)},
		{"write /etc", "echo x > /etc/sidecar-test"},
		{"write /root", "echo x > /root/sidecar-test"},
		{"write /var/tmp", "echo x > /var/tmp/sidecar-test"},
		{"write /dev/shm", "echo x > /dev/shm/sidecar-test"},
		{"write the work root", "echo x > " + filepath.Dir(a.Workdir) + "/x"},
		{"mkdir in /usr", "mkdir /usr/sidecar-test"},
		{"read /root", "ls /root"},
	} {
		if worldWritable[tc.name] && s.Caps().LandlockABI == 0 {
			continue // the documented gap without Landlock (Caps.Gaps, docs/operations.md)
		}
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, s, a.ID, sh(tc.script))
			if r.exitCode == 0 {
				t.Errorf("%q succeeded in lease A: %s", tc.script, r.stdout)
			}
			t.Logf("refused: %s", strings.TrimSpace(r.stderr))
		})
	}
	// What A may do.
	r := run(t, s, a.ID, sh(`echo hi > /tmp/a && cat /tmp/a && echo w > ./w && ls /tmp && cat /etc/hostname >/dev/null && sh -c 'kill -0 $$'`))
	if r.exitCode != 0 || !strings.Contains(r.stdout, "hi") || strings.Contains(r.stdout, "b-was-here") {
		t.Errorf("lease A's own work failed: exit %d, %q %q", r.exitCode, r.stdout, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(a.TmpDir, "a")); err != nil {
		t.Errorf("A's /tmp is not its TmpDir: %v", err)
	}
}

// A lease's mount namespace holds nothing under the roots the daemon mounts leases in
// (here the PTY root, where each test lease has its devpts instance): the second lease's
// helper starts in a copy of a namespace that has the first one's mounts, and detaches
// them; its own /dev/pts and /workspace binds stay.
func TestLeaseMountTableHoldsNoLeaseRoot(t *testing.T) {
	forEachHelper(t, testLeaseMountTableHoldsNoLeaseRoot)
}

func testLeaseMountTableHoldsNoLeaseRoot(t *testing.T, s *Sandbox) {
	a := newTestLease(t, s, nil)
	b := newTestLease(t, s, nil)
	for _, l := range []LeaseSpec{a, b} {
		r := run(t, s, l.ID, Spec{Argv: []string{"cat", "/proc/self/mountinfo"}})
		if r.exitCode != 0 {
			t.Fatalf("lease %s: exit %d: %s", l.ID, r.exitCode, r.stderr)
		}
		var points []string
		for _, line := range lines(r.stdout) {
			if f := strings.Fields(line); len(f) > 4 {
				points = append(points, f[4])
			}
		}
		for _, p := range points {
			if _, in := under(p, s.ptyRoot); in {
				t.Errorf("lease %s sees a mount at %s, under the PTY root %s", l.ID, p, s.ptyRoot)
			}
		}
		for _, want := range []string{"/dev/pts", Workspace, "/tmp"} {
			if !slices.Contains(points, want) {
				t.Errorf("lease %s has no mount at %s: %q", l.ID, want, points)
			}
		}
	}
}

func TestToolsRun(t *testing.T) { forEachHelper(t, testToolsRun) }

func testToolsRun(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	for _, c := range []struct {
		tool string
		pkg  string // the Debian package CI installs; "" for a tool CI may lack
		argv []string
	}{
		{"/usr/bin/python3", "python3", []string{"/usr/bin/python3", "-c", "import os,tempfile; tempfile.mkstemp(); print(os.getuid())"}},
		{"git", "", []string{"git", "init", "-q", "repo"}},
		{"git", "", []string{"sh", "-c", "cd repo && echo x > f && git add f && git -c user.name=t -c user.email=t@t commit -qm x && git log --oneline | grep -q x"}},
		{"cc", "gcc", []string{"sh", "-c", `printf '#include <stdio.h>\nint main(void) { puts("hello"); }\n' > /tmp/h.c && cc -o /tmp/h /tmp/h.c && /tmp/h | grep -qx hello`}},
		{"node", "", []string{"node", "-e", "require('fs').writeFileSync('/tmp/n', 'x')"}},
	} {
		if _, ok := testtool.Find(c.tool); !ok {
			if c.pkg != "" && testtool.RequireAll() {
				t.Errorf("%s is not installed (Debian: apt-get install %s; %s=1)", c.tool, c.pkg, testtool.RequireAllEnv)
			}
			t.Logf("skipping %s: not installed", c.tool)
			continue
		}
		if r := run(t, s, l.ID, Spec{Argv: c.argv}); r.exitCode != 0 {
			t.Errorf("%q: exit %d: %s", c.argv, r.exitCode, r.stderr)
		}
	}
}

// Sweep takes every cgroup under the parent that no known lease has, but a named cell's.
func TestSweepLeavesCells(t *testing.T) {
	s := newTestSandbox(t)
	cell, err := confine.NewCell(testCgroupParent, "sweep-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cell.Remove(context.Background()) })
	if err := cell.NewChild("w1", 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Sweep(context.Background(), func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cell.ChildDir("w1")); err != nil {
		t.Errorf("Sweep took the cell: %v", err)
	}
}
