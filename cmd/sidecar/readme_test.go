package main

import (
	"bufio"
	"github.com/sidecar-sandbox/sidecar/internal/testtool"
	"io/fs"
	"net"
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

// The README's tour runs as written from a copy of the checkout (under /root as root, the
// closed checkout `make run` moves its state out of): `make run` itself starts the daemon,
// the first block sources the settings it wrote, then every command of the CLI block and
// the curl block runs in that checkout, so a wrong path cannot come back.
func TestReadmeTour(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon binary")
	}
	blocks := tourBlocks(t)
	if len(blocks) != 3 {
		t.Fatalf("the tour has %d sh blocks, want 3 (settings, CLI, curl)", len(blocks))
	}
	for _, tool := range []struct{ name, pkg string }{{"make", "make"}, {"bash", "bash"}, {"curl", "curl"}, {"jq", "jq"}, {"tar", "tar"}} {
		testtool.Need(t, tool.name, tool.pkg, "the README's tour uses it")
	}
	goBin := testtool.Need(t, "go", "golang", "make run builds the daemon")
	parent := "/var/tmp" // not /tmp: a lease's /tmp hides it
	if os.Geteuid() == 0 {
		parent = "/root"
	}
	work, err := os.MkdirTemp(parent, "sidecar-readme-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeUnmounted(t, work) })
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}
	copyCheckout(t, "../..", work)
	makeEnv := func(args ...string) *exec.Cmd {
		cmd := exec.Command("make", append([]string{"-s", "GO=" + goBin}, args...)...)
		cmd.Dir = work
		return cmd
	}
	out, err := makeEnv("env").Output()
	if err != nil {
		t.Fatalf("make env: %v", err)
	}
	envFile := strings.TrimSpace(string(out))
	if parent == "/root" && strings.HasPrefix(envFile, work+"/") {
		t.Fatalf("make run keeps its state in %s, which lease uids cannot reach under /root", envFile)
	}
	if state := filepath.Dir(envFile); state != filepath.Join(work, ".state") {
		t.Cleanup(func() { removeUnmounted(t, state) }) // a closed checkout's state dir
	}

	// `make run`, on a free port and test-only cgroup and uid ranges.
	addr := freeAddr(t)
	run := makeEnv("run")
	run.Env = append(os.Environ(),
		"SIDECAR_LISTEN_ADDR="+addr,
		"SIDECAR_CGROUP_PARENT=sidecar-test-readme",
		"SIDECAR_UID_RANGE=234000-234999",
	)
	run.Env = append(run.Env, quotaEnv()...)
	run.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr := &testtool.Buffer{}
	run.Stdout, run.Stderr = stderr, stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = run.Wait(); close(exited) }()
	t.Cleanup(func() {
		stopGroup(t, run.Process.Pid)
		<-exited
		for _, p := range []string{"", "cpu/", "cpuacct/", "memory/", "pids/", "freezer/"} {
			_ = syscall.Rmdir("/sys/fs/cgroup/" + p + "sidecar-test-readme")
		}
	})
	printed := map[string]string{}
	deadline := time.Now().Add(5 * time.Minute) // make run builds first
	for len(printed) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("no client lines from make run:\n%s", stderr.String())
		}
		select {
		case <-exited:
			t.Fatalf("make run exited:\n%s", stderr.String())
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
	if !strings.Contains(stderr.String(), envFile) {
		t.Errorf("make run does not print the path of its settings, %s:\n%s", envFile, stderr.String())
	}

	// The settings make run wrote are what the daemon itself prints.
	written, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(written)), "\n") {
		kv, _ := strings.CutPrefix(line, "export ")
		k, v, _ := strings.Cut(kv, "=")
		if want, ok := printed[k]; !ok || want != v {
			t.Errorf("%s says %s=%s; the daemon prints %s=%s", envFile, k, v, k, want)
		}
		if strings.HasSuffix(k, "_FILE") {
			if _, err := os.Stat(v); err != nil {
				t.Errorf("%s's %s: %v", envFile, k, err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Every script runs in the checkout after the first block, as in the second shell.
	settings := strings.TrimSpace(blocks[0])
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work}
	shell := func(script string) (string, error) {
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", settings+"\n"+script)
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
		out, err := shell(cmdline)
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
	script := strings.ReplaceAll(blocks[2], "curl ", "curl -fsS ")
	out2, err := shell(script)
	if err != nil {
		t.Fatalf("README curl block: %v\n%s", err, out2)
	}
	if !strings.Contains(out2, "ok") || !strings.Contains(out2, `"api_version":"v1"`) || !strings.Contains(out2, "Linux") {
		t.Fatalf("README curl block printed:\n%s", out2)
	}
}

// copyCheckout copies the source tree at src into dst: what a fresh clone holds, without
// the git metadata, builds, state and caches.
func copyCheckout(t *testing.T, src, dst string) {
	t.Helper()
	skip := map[string]bool{".git": true, "bin": true, ".state": true, ".cache": true, "node_modules": true}
	// The TypeScript client's build output is not committed; the console's bundle is.
	skipPath := map[string]bool{filepath.Join("client", "ts", "dist"): true}
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if (skip[d.Name()] || skipPath[rel]) && rel != "." {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, info.Mode().Perm())
		}
		return nil // sockets, links: nothing a fresh clone has
	})
	if err != nil {
		t.Fatalf("copying the checkout: %v", err)
	}
}

// freeAddr is a loopback address with a port nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// stopGroup sends SIGTERM to the process group of make run (make, its shell and the
// daemon) and waits, bounded, for every member to be gone.
func stopGroup(t *testing.T, pgid int) {
	t.Helper()
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	for deadline := time.Now().Add(30 * time.Second); syscall.Kill(-pgid, 0) == nil; {
		if time.Now().After(deadline) {
			t.Errorf("make run's processes outlived SIGTERM by 30 s: killing them")
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The README's layout cannot go stale: each folder it names exists, and each folder that
// holds a Go package is named.
func TestReadmeLayout(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(b), "## Layout\n")
	if !ok {
		t.Fatal(`README.md has no "## Layout"`)
	}
	_, layout, _ = strings.Cut(layout, "```\n")
	layout, _, _ = strings.Cut(layout, "```")
	named := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(layout), "\n") {
		column := regexp.MustCompile(`\s{2,}`).Split(line, 2)[0]
		for _, entry := range strings.Split(column, ", ") {
			for _, dir := range expandBraces(entry) {
				dir = strings.TrimSuffix(dir, "/")
				named[dir] = true
				if st, err := os.Stat(filepath.Join("../..", dir)); err != nil || !st.IsDir() {
					t.Errorf("the README's layout names %s/, which is not a folder", dir)
				}
			}
		}
	}
	for _, dir := range goPackageDirs(t, "../..") {
		if !named[dir] {
			t.Errorf("the README's layout does not name %s/, a Go package", dir)
		}
	}
}

// expandBraces expands one {a,b,…} group: "x/{,y/}" is "x/" and "x/y/".
func expandBraces(s string) []string {
	open, close := strings.Index(s, "{"), strings.Index(s, "}")
	if open < 0 || close < open {
		return []string{s}
	}
	var out []string
	for _, alt := range strings.Split(s[open+1:close], ",") {
		out = append(out, s[:open]+alt+s[close+1:])
	}
	return out
}

// goPackageDirs lists, relative to root, the folders holding .go files, as the go tool
// sees packages (testdata and dot- or underscore-folders are not).
func goPackageDirs(t *testing.T, root string) []string {
	t.Helper()
	seen := map[string]bool{}
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && p != root && (name == "testdata" || name == "node_modules" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(name, ".go") {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			if !seen[rel] {
				seen[rel] = true
				dirs = append(dirs, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}
