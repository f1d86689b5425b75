package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tourBlocks are the ```sh blocks of the README's "A quick tour", in order.
func tourBlocks(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, tour, ok := strings.Cut(string(b), "## A quick tour")
	if !ok {
		t.Fatal(`README.md has no "## A quick tour"`)
	}
	tour, _, _ = strings.Cut(tour, "\n## ")
	var blocks []string
	for {
		_, rest, ok := strings.Cut(tour, "```sh\n")
		if !ok {
			return blocks
		}
		block, after, _ := strings.Cut(rest, "```")
		blocks = append(blocks, block)
		tour = after
	}
}

// The README's tour runs as written against a fresh state dir: the daemon started the way
// `make run` starts it, the exported lines pasted as printed in the README, then every
// command of the CLI block and the curl block, so a wrong path cannot come back.
func TestReadmeTour(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon binary")
	}
	blocks := tourBlocks(t)
	if len(blocks) != 3 {
		t.Fatalf("the tour has %d sh blocks, want 3 (exports, CLI, curl)", len(blocks))
	}
	for _, tool := range []string{"curl", "jq", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the tour needs %s (.ci/run installs it): %v", tool, err)
		}
	}
	work, err := os.MkdirTemp("/var/tmp", "sidecar-readme-") // not /tmp: a lease's /tmp hides it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := buildBinary(t, filepath.Join(work, "bin"))

	// `make run`: a token made by `sidecar token` in .state, then serve with self-signed TLS.
	state := filepath.Join(work, ".state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	token, err := exec.Command(bin, "token").Output()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "auth-token"), token, 0o600); err != nil {
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
		"SIDECAR_AUTH_TOKEN_FILE=" + filepath.Join(state, "auth-token"),
		"SIDECAR_TLS_SELF_SIGNED=true",
		"SIDECAR_ISOLATION=" + isolation,
		// Beyond `make run`: a free port and test-only cgroup and uid ranges.
		"SIDECAR_LISTEN_ADDR=127.0.0.1:0",
		"SIDECAR_CGROUP_PARENT=sidecar-test-readme",
		"SIDECAR_UID_RANGE=234000-234999",
	}
	stderr := &lockedBuffer{}
	serve.Stderr = stderr
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = serve.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = serve.Process.Kill()
			<-exited
		}
		for _, p := range []string{"", "cpu/", "cpuacct/", "memory/", "pids/", "freezer/"} {
			_ = syscall.Rmdir("/sys/fs/cgroup/" + p + "sidecar-test-readme")
		}
	})
	printed := map[string]string{}
	deadline := time.Now().Add(60 * time.Second)
	for len(printed) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("no client lines from serve:\n%s", stderr.String())
		}
		select {
		case <-exited:
			t.Fatalf("serve exited:\n%s", stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		sc := bufio.NewScanner(strings.NewReader(stderr.String()))
		for sc.Scan() {
			if kv, ok := strings.CutPrefix(sc.Text(), "export "); ok {
				k, v, _ := strings.Cut(kv, "=")
				printed[k] = v
			}
		}
	}
	addr := strings.TrimPrefix(printed["SANDBOX_REMOTE_URL"], "https://")

	// The README's exports, with $PWD the checkout (here: work) and the tour's fixed port
	// replaced by the test daemon's; each must be what the daemon itself prints.
	localize := func(s string) string {
		return strings.ReplaceAll(strings.ReplaceAll(s, "$PWD", work), "127.0.0.1:7443", addr)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work}
	for _, line := range strings.Split(strings.TrimSpace(blocks[0]), "\n") {
		kv, ok := strings.CutPrefix(line, "export ")
		if !ok {
			t.Fatalf("README export block: %q is not an export", line)
		}
		k, v, _ := strings.Cut(localize(kv), "=")
		if want, ok := printed[k]; !ok || want != v {
			t.Errorf("README exports %s=%s; the daemon prints %s=%s", k, v, k, want)
		}
		if strings.HasSuffix(k, "_FILE") {
			if _, err := os.Stat(v); err != nil {
				t.Errorf("README's %s: %v", k, err)
			}
		}
		env = append(env, k+"="+v)
	}
	if t.Failed() {
		t.FailNow()
	}

	run := func(script string) (string, error) {
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
		cmd.Dir = work
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// The inputs the tour assumes: a ./src tree (cp) and notes.txt (curl -T).
	if err := os.MkdirAll(filepath.Join(work, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(work, "src", "main.go"), []byte("package main\n"), 0o644)
	os.WriteFile(filepath.Join(work, "notes.txt"), []byte("notes\n"), 0o644)

	// The CLI block, line by line; LEASE is the id `leases new` printed. `shell` needs a
	// terminal and is the only line not run.
	leaseID := ""
	idLine := regexp.MustCompile(`(?m)^id:\s+(\S+)`)
	ran := 0
	for _, line := range strings.Split(strings.TrimSpace(blocks[1]), "\n") {
		cmdline, _, _ := strings.Cut(line, "  #")
		cmdline = strings.TrimSpace(cmdline)
		if cmdline == "" || strings.HasPrefix(cmdline, "bin/sidecar shell") {
			continue
		}
		if strings.Contains(cmdline, "LEASE") {
			if leaseID == "" {
				t.Fatalf("%q needs a lease, but no command before it made one", cmdline)
			}
			cmdline = regexp.MustCompile(`\bLEASE\b`).ReplaceAllString(cmdline, leaseID)
		}
		out, err := run(cmdline)
		if err != nil {
			t.Fatalf("README: %s: %v\n%s", cmdline, err, out)
		}
		if m := idLine.FindStringSubmatch(out); m != nil && strings.Contains(cmdline, "leases new") {
			leaseID = m[1]
		}
		ran++
	}
	if ran < 7 {
		t.Fatalf("ran only %d commands of the CLI block", ran)
	}
	// The curl block as one script (its variables carry over); a refusal fails curl -f.
	script := localize(blocks[2])
	script = strings.ReplaceAll(script, "curl ", "curl -fsS ")
	out, err := run(script)
	if err != nil {
		t.Fatalf("README curl block: %v\n%s", err, out)
	}
	if !strings.Contains(out, "ok") || !strings.Contains(out, `"api_version":"v1"`) || !strings.Contains(out, "Linux") {
		t.Fatalf("README curl block printed:\n%s", out)
	}
}
