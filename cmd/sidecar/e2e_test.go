package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

// buildBinary builds this command into dir (the real binary, as `make build` does).
func buildBinary(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "sidecar")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The README's promise: run the daemon on its defaults, paste the printed lines, and the
// CLI works against it; SIGTERM stops it cleanly.
func TestServeAndCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon binary")
	}
	work, err := os.MkdirTemp("/var/tmp", "sidecar-cli-e2e-") // not /tmp: a lease's private /tmp would hide it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeUnmounted(t, work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := buildBinary(t, work)
	state := filepath.Join(work, "state")

	tokenOut, err := exec.Command(bin, "token").Output()
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tokenOut))
	if len(token) < 43 {
		t.Fatalf("sidecar token printed %d characters", len(token))
	}
	tokenFile := filepath.Join(work, "auth-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	isolation := "none"
	if os.Geteuid() == 0 {
		isolation = "strict"
	}
	serve := exec.Command(bin, "serve")
	serve.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"SIDECAR_STATE_DIR=" + state,
		"SIDECAR_AUTH_TOKEN_FILE=" + tokenFile,
		"SIDECAR_TLS_SELF_SIGNED=true",
		"SIDECAR_LISTEN_ADDR=127.0.0.1:0",
		"SIDECAR_ISOLATION=" + isolation,
		"SIDECAR_CGROUP_PARENT=sidecar-test-cli",
		"SIDECAR_UID_RANGE=232000-232999",
		"SCRIPT_ENABLED=false",
	}
	serve.Env = append(serve.Env, quotaEnv()...)
	stderr := &testtool.Buffer{}
	serve.Stderr = stderr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	// exited is closed when serve has been waited for; waitErr is its result.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = serve.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			serve.Process.Kill()
			<-exited
		}
		for _, p := range []string{"cpu", "cpuacct", "memory", "pids", "freezer"} {
			syscall.Rmdir("/sys/fs/cgroup/" + p + "/sidecar-test-cli")
		}
	})

	// The daemon prints the client lines once it listens.
	env := map[string]string{}
	deadline := time.Now().Add(60 * time.Second)
	for len(env) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("no client lines from serve:\n%s", stderr.String())
		}
		select {
		case <-exited:
			t.Fatalf("serve exited: %v\n%s", waitErr, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		sc := bufio.NewScanner(strings.NewReader(stderr.String()))
		for sc.Scan() {
			if kv, ok := strings.CutPrefix(sc.Text(), "export "); ok {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		}
	}
	if strings.Contains(stderr.String(), token) {
		t.Fatal("serve printed the token")
	}
	cli := func(stdin string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work}
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdin = strings.NewReader(stdin)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("sidecar %v: %v", args, err)
		}
		if ee != nil && testing.Verbose() {
			t.Logf("sidecar %v: exit %d: %s", args, ee.ExitCode(), errOut.String())
		}
		return out.String(), cmd.ProcessState.ExitCode()
	}

	out, code := cli("", "leases", "new", "cli-session", "-o", "json")
	var l apitype.Lease
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || l.ID == "" || l.Token == "" {
		t.Fatalf("leases new: exit %d: %s", code, out)
	}
	if out, code = cli("", "leases", "ls"); code != 0 || !strings.Contains(out, l.ID) || !strings.Contains(out, "cli-session") {
		t.Fatalf("leases ls: exit %d:\n%s", code, out)
	}
	if out, code = cli("", "exec", l.ID, "--", "sh", "-c", "echo hello; exit 3"); code != 3 || out != "hello\n" {
		t.Fatalf("exec: exit %d, out %q", code, out)
	}
	if out, code = cli("piped\n", "exec", "-i", l.ID, "--", "cat"); code != 0 || out != "piped\n" {
		t.Fatalf("exec -i: exit %d, out %q", code, out)
	}
	// Streamed losslessly: past the 1 MiB a captured exec keeps, every byte, in order.
	if out, code = cli("", "exec", "--lossless", l.ID, "--", "seq", "1", "400000"); code != 0 || out != seqText(400000) {
		t.Fatalf("exec --lossless: exit %d, %d bytes of output, want %d", code, len(out), len(seqText(400000)))
	}
	// A shell session: state carries from one run to the next; exit codes pass through.
	sid, code := cli("", "shells", "new", l.ID)
	sid = strings.TrimSpace(sid)
	if code != 0 || sid == "" {
		t.Fatalf("shells new: exit %d, out %q", code, sid)
	}
	if out, code = cli("", "shells", "run", l.ID, sid, "--", "mkdir -p s && cd s && export B=2"); code != 0 {
		t.Fatalf("shells run cd: exit %d, out %q", code, out)
	}
	if out, code = cli("", "shells", "run", l.ID, sid, "--", "basename", "$PWD;", "echo", "$B;", "exit_code() { return 4; }; exit_code"); code != 4 || out != "s\n2\n" {
		t.Fatalf("shells run: exit %d, out %q", code, out)
	}
	if out, code = cli("", "shells", "run", "--timeout", "300ms", l.ID, sid, "--", "sleep", "100"); code != exitTimedOut {
		t.Fatalf("shells run timeout: exit %d, out %q", code, out)
	}
	if out, code = cli("", "shells", "ls", l.ID); code != 0 || !strings.Contains(out, sid) || !strings.Contains(out, "bash") {
		t.Fatalf("shells ls: exit %d:\n%s", code, out)
	}
	if out, code = cli("", "shells", "rm", l.ID, sid); code != 0 {
		t.Fatalf("shells rm: exit %d, out %q", code, out)
	}
	if _, code = cli("", "shells", "run", l.ID, sid, "--", "true"); code != exitFailure {
		t.Fatalf("shells run on a closed session: exit %d", code)
	}
	local := filepath.Join(work, "upload.txt")
	os.WriteFile(local, []byte("round trip\n"), 0o644)
	if _, code = cli("", "cp", local, l.ID+":in/file.txt"); code != 0 {
		t.Fatalf("cp up: exit %d", code)
	}
	back := filepath.Join(work, "download.txt")
	if _, code = cli("", "cp", l.ID+":in/file.txt", back); code != 0 {
		t.Fatalf("cp down: exit %d", code)
	}
	if b, _ := os.ReadFile(back); string(b) != "round trip\n" {
		t.Fatalf("cp round trip: %q", b)
	}
	// The file tools.
	if out, code = cli("", "find", "--name", "*.txt", l.ID+":"); code != 0 || out != "in/file.txt\n" {
		t.Fatalf("find: exit %d, out %q", code, out)
	}
	if out, code = cli("", "grep", "-F", "trip", l.ID+":"); code != 0 || out != "in/file.txt:1:round trip\n" {
		t.Fatalf("grep: exit %d, out %q", code, out)
	}
	if _, code = cli("", "grep", "absent", l.ID+":"); code != 1 {
		t.Fatalf("grep without a match: exit %d, want 1", code)
	}
	if out, code = cli("", "stat", "-o", "json", l.ID+":in/file.txt"); code != 0 || !strings.Contains(out, `"size": 11`) {
		t.Fatalf("stat: exit %d, out %q", code, out)
	}
	if _, code = cli("", "stat", l.ID+":nothing"); code != 1 {
		t.Fatalf("stat of a missing path: exit %d, want 1", code)
	}
	if _, code = cli("", "edit", "--old", "round", "--new", "square", l.ID+":in/file.txt"); code != 0 {
		t.Fatalf("edit: exit %d", code)
	}
	if _, code = cli("", "edit", "--old", "round", "--new", "square", l.ID+":in/file.txt"); code == 0 {
		t.Fatal("edit of absent text succeeded")
	}
	if out, _ = cli("", "exec", l.ID, "--", "cat", "in/file.txt"); out != "square trip\n" {
		t.Fatalf("after edit: %q", out)
	}
	watch := exec.Command(bin, "watch", "-r", l.ID+":in")
	watch.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work}
	for k, v := range env {
		watch.Env = append(watch.Env, k+"="+v)
	}
	watchOut, watchErr := &testtool.Buffer{}, &testtool.Buffer{}
	watch.Stdout, watch.Stderr = watchOut, watchErr
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor := func(b *testtool.Buffer, s string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(b.String(), s); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("watch: no %q in %q (stderr %q)", s, watchOut.String(), watchErr.String())
			}
		}
	}
	waitFor(watchErr, "watching")
	cli("", "exec", l.ID, "--", "touch", "in/new")
	waitFor(watchOut, "create new\n")
	watch.Process.Signal(syscall.SIGINT)
	if err := watch.Wait(); err != nil {
		t.Fatalf("watch after SIGINT: %v (%s)", err, watchErr.String())
	}
	if out, code = cli("", "leases", "show", l.ID); code != 0 || !strings.Contains(out, `"session_id": "cli-session"`) {
		t.Fatalf("leases show: exit %d:\n%s", code, out)
	}
	// drain --wait with a lease still active says what it waits for, on stderr, and fails
	// when its time is up; stdout keeps its one result line for scripts.
	drain := exec.Command(bin, "drain", "--wait", "1s")
	drain.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work}
	for k, v := range env {
		drain.Env = append(drain.Env, k+"="+v)
	}
	var drainOut, drainErr bytes.Buffer
	drain.Stdout, drain.Stderr = &drainOut, &drainErr
	if err := drain.Run(); err == nil || drainOut.Len() != 0 ||
		!strings.Contains(drainErr.String(), "waiting for 1 active leases") || !strings.Contains(drainErr.String(), "1 leases still active") {
		t.Fatalf("drain --wait with a lease active: %v, stdout %q, stderr %q", err, drainOut.String(), drainErr.String())
	}
	if _, code = cli("", "leases", "rm", l.ID); code != 0 {
		t.Fatalf("leases rm: exit %d", code)
	}
	if _, code = cli("", "leases", "show", l.ID); code == 0 {
		t.Fatal("leases show after rm succeeded")
	}
	if _, code = cli("", "cleanup"); code != 0 {
		t.Fatalf("cleanup: exit %d", code)
	}

	// Drain by the CLI and by signal: a new lease is refused with the stable code, the
	// undo takes leases again.
	if out, code = cli("", "drain", "--wait", "10s"); code != 0 || out != "draining; 0 leases active\n" {
		t.Fatalf("drain: exit %d: %q", code, out)
	}
	if out, code = cli("", "leases", "new", "drained-session"); code != exitFailure {
		t.Fatalf("leases new while draining: exit %d (want %d): %q", code, exitFailure, out)
	}
	if out, code = cli("", "drain", "--undo", "-o", "json"); code != 0 || !strings.Contains(out, `"draining": false`) {
		t.Fatalf("drain --undo: exit %d: %q", code, out)
	}

	// SIGTERM: a clean, prompt exit.
	serve.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("serve after SIGTERM: %v\n%s", waitErr, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("serve did not stop after SIGTERM")
	}
	if !strings.Contains(stderr.String(), "sidecar stopped") {
		t.Fatalf("no orderly shutdown in the log:\n%s", stderr.String())
	}
}

// A bad configuration is refused at start, naming every bad variable.
func TestServeRefusesBadConfig(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon binary")
	}
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	cmd := exec.Command(bin, "serve")
	cmd.Env = []string{"SIDECAR_AUTH_TOKEN=short", "SIDECAR_MAX_LEASES=lots", "SIDECAR_STATE_DIR=" + dir}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	cmd.Stdout = io.Discard
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("serve with a bad config: %v", err)
	}
	for _, want := range []string{"SIDECAR_AUTH_TOKEN must be at least 32", "SIDECAR_MAX_LEASES", "TLS is required"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr does not say %q:\n%s", want, errOut.String())
		}
	}
}

// quotaEnv is SIDECAR_DISK_QUOTA=off where mkfs.ext4 is missing: the default, a loop
// filesystem per lease, refuses to start in strict isolation without e2fsprogs, and these
// tests are about the CLI. Under SIDECAR_TEST_REQUIRE_ALL=1 (CI) the default holds.
func quotaEnv() []string {
	if _, ok := testtool.Find("mkfs.ext4"); ok || testtool.RequireAll() {
		return nil
	}
	return []string{"SIDECAR_DISK_QUOTA=off"}
}

// removeUnmounted removes the test's tree, after unmounting (lazily) the lease
// filesystems a failed run left in it; it keeps the tree, with an error, if anything is
// still mounted there: RemoveAll through a mount would delete what the mount holds.
func removeUnmounted(t *testing.T, dir string) {
	var points []string
	info, _ := os.ReadFile("/proc/thread-self/mountinfo")
	for line := range strings.SplitSeq(string(info), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append([]string{f[4]}, points...) // innermost first
		}
	}
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
	info, _ = os.ReadFile("/proc/thread-self/mountinfo")
	if strings.Contains(string(info), " "+dir+"/") {
		t.Errorf("not removing %s: something is still mounted in it", dir)
		return
	}
	_ = os.RemoveAll(dir)
}

// seqText is what `seq 1 n` prints.
func seqText(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.String()
}
