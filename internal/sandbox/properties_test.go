package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// What a lease process is, seen from inside: its credentials, capabilities, OOM score,
// mounts and the processes it can see.
func TestLeaseProcessView(t *testing.T) { forEachHelper(t, testLeaseProcessView) }

func testLeaseProcessView(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	r := run(t, s, l.ID, sh(`grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs):' /proc/self/status
echo oom $(cat /proc/self/oom_score_adj)
grep -E '^[^ ]+ [^ ]+ [^ ]+ [^ ]+ /(tmp|proc) ' /proc/self/mountinfo
echo owners $(for p in /proc/[0-9]*; do stat -c %u "$p"; done | sort -u)`))
	id := strconv.Itoa(l.UID)
	zero := "0000000000000000"
	want := map[string]string{
		"Uid:": id + " " + id + " " + id + " " + id, "Gid:": id + " " + id + " " + id + " " + id,
		"Groups:": "", "CapInh:": zero, "CapPrm:": zero, "CapEff:": zero, "CapAmb:": zero,
		"NoNewPrivs:": "1", "oom": "500", "owners": id,
	}
	got := map[string]string{}
	var mounts []string
	for _, line := range lines(r.stdout) {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == "/tmp" || f[4] == "/proc") {
			mounts = append(mounts, line)
			continue
		}
		if len(f) > 0 {
			got[f[0]] = strings.Join(f[1:], " ")
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s %q, want %q", k, got[k], v)
		}
	}
	// The last mount on each path is the one in force.
	var tmp, proc string
	for _, m := range mounts {
		if strings.Fields(m)[4] == "/tmp" {
			tmp = m
		} else {
			proc = m
		}
	}
	if !strings.Contains(tmp, "nosuid") || !strings.Contains(tmp, "nodev") {
		t.Errorf("/tmp mount %q, want nosuid,nodev", tmp)
	}
	if !strings.Contains(proc, "hidepid=invisible") || !strings.Contains(proc, "nosuid") || !strings.Contains(proc, "noexec") {
		t.Errorf("/proc mount %q, want a private proc with hidepid=invisible,nosuid,noexec", proc)
	}
	if t.Failed() {
		t.Logf("output:\n%s%s", r.stdout, r.stderr)
	}
}

// A lease does not see the host's cgroup tree, which names every daemon's parent and
// every lease with its host pids: /sys/fs/cgroup is empty and read-only, and its own
// cgroups are the root of its cgroup namespace. The host's tree holds the lease's cgroup
// under the test parent, which shows the test can fail.
func TestLeaseCgroupView(t *testing.T) { forEachHelper(t, testLeaseCgroupView) }

func testLeaseCgroupView(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	var host []string
	for _, d := range cgroupDirs(s, l.ID) {
		if _, err := os.Stat(d); err == nil {
			host = append(host, d)
		}
	}
	if len(host) == 0 {
		t.Fatalf("control: the lease's cgroup %s/%s is not in the host's /sys/fs/cgroup", testCgroupParent, l.ID)
	}
	r := run(t, s, l.ID, sh(`echo entries $(ls -A /sys/fs/cgroup | wc -l)
touch /sys/fs/cgroup/x 2>/dev/null && echo writable
sed 's/^[^:]*:[^:]*:/path /' /proc/self/cgroup | sort -u`))
	got := lines(r.stdout)
	want := []string{"entries 0", "path /"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("seen from the lease: %q, want %q (stderr %q)", got, want, r.stderr)
	}
}

// Landlock, not file modes, stops the lease here: a world-readable file and a
// world-writable directory outside the lease. The same uid without the helper reaches both,
// which shows the test can fail.
func TestLandlockConfines(t *testing.T) { forEachHelper(t, testLandlockConfines) }

func testLandlockConfines(t *testing.T, s *Sandbox) {
	if s.Caps().LandlockABI == 0 {
		t.Skip("no Landlock on this kernel (not in lsm=, or too old): no landlock-fs layer to check; TestIsolationAtEachLandlockABI checks what holds without it")
	}
	l := newTestLease(t, s, nil)
	base := filepath.Dir(l.Workdir) // removed by newTestLease's cleanup
	readable, shared := filepath.Join(base, "readable"), filepath.Join(base, "shared")
	if err := os.WriteFile(readable, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	script := "cat " + readable + " || exit 1; echo y > " + shared + "/y || exit 2"
	control := exec.Command("/bin/sh", "-c", script)
	control.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(l.UID), Gid: uint32(l.GID)}}
	if out, err := control.CombinedOutput(); err != nil {
		t.Fatalf("control without Landlock: %v: %s", err, out)
	}
	os.Remove(filepath.Join(shared, "y"))
	for _, tc := range []struct {
		script string
		code   int
	}{
		{"cat " + readable, 1},
		{"echo y > " + shared + "/y", 2},
	} {
		r := run(t, s, l.ID, sh(tc.script))
		if r.exitCode == 0 {
			t.Errorf("%q succeeded in the lease", tc.script)
		}
	}
}

// removeSpares removes the child cgroups the engine made ahead for the lease's next plain
// start, which then takes one that is gone. A plain start (output that is not a file: no
// launcher or zygote takes it) has one made.
func removeSpares(t *testing.T, s *Sandbox, id string) {
	t.Helper()
	cmd, tr, err := s.Command(id, Spec{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = new(strings.Builder)
	if err := tr.Start(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	s.settle()
	launcher, _ := s.eng.Launcher(id)
	removed := 0
	for _, child := range children(t, s, id) {
		// Spares are empty: not the launcher's (which, on v1, may not have joined it yet),
		// nor the zygote's.
		if pids, err := s.cg.ChildPids(id, child); child != launcher.Cgroup && err == nil && len(pids) == 0 {
			if err := s.cg.RemoveChild(id, child); err != nil {
				t.Fatal(err)
			}
			removed++
		}
	}
	if removed == 0 {
		t.Fatal("no spare child cgroup to remove")
	}
}

// Setup failures after Command returned come back from Start as a *SetupError naming the
// step: a child cgroup removed under the command (v1: the helper's join; v2: clone3) and a
// working directory the lease's uid may no longer enter. A target no longer executable is
// the target's exit status (126), as in a shell, with the reason on stderr.
func TestSetupFailuresReported(t *testing.T) { forEachHelper(t, testSetupFailuresReported) }

func testSetupFailuresReported(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	sub, exe := filepath.Join(l.Workdir, "sub"), filepath.Join(l.Workdir, "prog")
	for _, tc := range []struct {
		name   string
		spec   Spec
		before func(Tree)
		step   string // "": no SetupError, exit 126 with msg on stderr
		msg    string
	}{
		{"cgroup removed", Spec{Argv: []string{"true"}}, func(Tree) { removeSpares(t, s, l.ID) }, "join cgroup", ""},
		{"dir closed to the lease", Spec{Argv: []string{"true"}, Dir: "sub"}, func(Tree) { os.Chmod(sub, 0o700) }, "chdir /workspace/sub", "setup: chdir"},
		{"not executable", Spec{Argv: []string{"./prog"}}, func(Tree) { os.Chmod(exe, 0o644) }, "", "./prog"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.Mkdir(sub, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				t.Fatal(err)
			}
			if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd, tr, err := s.Command(l.ID, tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			var stderr strings.Builder
			cmd.Stderr = &stderr
			tc.before(tr)
			err = tr.Start()
			var se *SetupError
			if tc.step != "" {
				if !errors.As(err, &se) || se.Step != tc.step || !strings.Contains(se.Msg, tc.msg) {
					t.Errorf("Start = %v, want a SetupError at %q mentioning %q", err, tc.step, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Start = %v, want the exec failure as the exit status", err)
			}
			cmd.Wait()
			if cmd.ProcessState.ExitCode() != 126 || !strings.Contains(stderr.String(), tc.msg) {
				t.Errorf("exit %d, stderr %q; want 126 mentioning %q", cmd.ProcessState.ExitCode(), stderr.String(), tc.msg)
			}
		})
	}
}
