// Package outsidetest tests what a newcomer does from outside any one package: make run
// in a checkout, and the Go client used from another module.
package outsidetest

import (
	"bytes"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// daemonIn returns the pid of the process in process group pgid running a binary named
// sidecar, and the path of that binary (the kernel's word, "(deleted)" once replaced).
func daemonIn(pgid int) (int, string) {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, _ := strconv.Atoi(filepath.Base(p))
		exe, err := os.Readlink(p + "/exe")
		if g, _ := syscall.Getpgid(pid); err == nil && g == pgid && strings.HasPrefix(filepath.Base(exe), "sidecar") && !strings.Contains(filepath.Base(exe), "init") {
			return pid, exe
		}
	}
	return 0, ""
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// A second make run in the checkout of a running one refuses before it builds: the
// running daemon's binaries (its sidecar-init starts every lease process) stay as they
// were.
func TestSecondMakeRunLeavesTheRunningDaemonAlone(t *testing.T) {
	testtool.Need(t, "make", "make", "it runs make run")
	state, err := os.MkdirTemp("/var/tmp", "sidecar-maketest-")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	run := func() *exec.Cmd {
		// BINDIR in the test's dir: the checkout's bin/ is not the test's to replace.
		cmd := exec.Command("make", "-C", "../..", "run", "STATE="+state, "BINDIR="+filepath.Join(state, "build"), "RUN_ADDR="+addr, "ISOLATION=none")
		// No lease is made: no isolation, no disk quota, and a uid range of its own keep
		// the daemon off every other daemon's ground.
		cmd.Env = append(os.Environ(), "SIDECAR_DISK_QUOTA=off", "SIDECAR_UID_RANGE=242000-242099", "SCRIPT_ENABLED=false")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return cmd
	}

	first := run()
	var out1 testtool.Buffer
	first.Stdout, first.Stderr = &out1, &out1
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = first.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-first.Process.Pid, syscall.SIGTERM) // make and the daemon it runs: the group we made
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-first.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if mounts, _ := os.ReadFile("/proc/self/mountinfo"); !bytes.Contains(mounts, []byte(" "+state)) {
			_ = os.RemoveAll(state)
		} else {
			t.Errorf("left %s: something is mounted under it", state)
		}
	})
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(out1.String(), "sidecar serving") {
		select {
		case <-exited:
			t.Fatalf("the first make run ended:\n%s", out1.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first make run does not serve after 3 minutes:\n%s", out1.String())
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
	pid, exe := daemonIn(first.Process.Pid)
	if pid == 0 {
		t.Fatalf("no daemon in make run's process group:\n%s", out1.String())
	}
	initPath := filepath.Join(filepath.Dir(exe), "sidecar-init")
	exeIno, initIno := inode(t, exe), inode(t, initPath)

	second := run()
	out2, err := second.CombinedOutput()
	if err == nil || !strings.Contains(string(out2), "already runs (pid "+strconv.Itoa(pid)) {
		t.Fatalf("second make run: %v, want a refusal naming pid %d:\n%s", err, pid, out2)
	}
	if strings.Contains(string(out2), "go build") {
		t.Errorf("the second make run built before refusing:\n%s", out2)
	}
	if _, now := daemonIn(first.Process.Pid); now != exe || inode(t, exe) != exeIno || inode(t, initPath) != initIno {
		t.Fatalf("the running daemon's binaries changed: %s → %s", exe, now)
	}
}
