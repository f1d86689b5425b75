package sandbox

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sidecar-sandbox/sidecar/sidecar/process"
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

// Setup failures after Command returned come back from Started as a *SetupError with the
// helper's exit code: a working directory the lease's uid may no longer enter (125) and a target no longer executable
// (126).
func TestSetupFailuresReported(t *testing.T) { forEachHelper(t, testSetupFailuresReported) }

func testSetupFailuresReported(t *testing.T, s *Sandbox) {
	l := newTestLease(t, s, nil)
	sub, exe := filepath.Join(l.Workdir, "sub"), filepath.Join(l.Workdir, "prog")
	for _, tc := range []struct {
		name   string
		spec   process.Spec
		before func()
		code   int
		msg    string
	}{
		{"dir closed to the lease", process.Spec{Argv: []string{"true"}, Dir: "sub"}, func() { os.Chmod(sub, 0o700) }, 125, "chdir"},
		{"not executable", process.Spec{Argv: []string{"./prog"}}, func() { os.Chmod(exe, 0o644) }, 126, "./prog"},
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
			tc.before()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			err = tr.(*tree).Started(context.Background())
			cmd.Wait()
			var se *SetupError
			if !errors.As(err, &se) || se.Code != tc.code || !strings.Contains(se.Msg, tc.msg) || cmd.ProcessState.ExitCode() != tc.code {
				t.Errorf("Started = %v (exit %d), want a SetupError %d mentioning %q", err, cmd.ProcessState.ExitCode(), tc.code, tc.msg)
			}
		})
	}
}
