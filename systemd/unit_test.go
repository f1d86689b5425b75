package systemd

// Checks of sidecar.service and sidecar.env: systemd's own verifier and security analyzer
// (CI has systemd-analyze; `go test ./systemd/` is the CI step), and the properties the
// daemon relies on.

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/testtool"
)

const (
	unitFile = "sidecar.service"
	envFile  = "sidecar.env"
	execPath = "/usr/local/bin/sidecar"
	// maxExposure is the top of the "OK" band of systemd-analyze security.
	maxExposure = 5.0
)

func systemdAnalyze(t *testing.T, args ...string) (string, error) {
	t.Helper()
	path := testtool.Need(t, "systemd-analyze", "systemd", "it checks the unit file")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	return string(out), err
}

// unitWithFakeBinary copies the unit into a temporary directory, pointing ExecStart= at an
// executable that exists there, since verify checks that the binary is executable.
func unitWithFakeBinary(t *testing.T) string {
	t.Helper()
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sidecar")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart="+execPath+" ") {
		t.Fatalf("ExecStart= does not run %s", execPath)
	}
	path := filepath.Join(dir, unitFile)
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(string(unit), execPath, bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestUnitVerifies(t *testing.T) {
	out, err := systemdAnalyze(t, "verify", unitWithFakeBinary(t))
	if err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

var exposureRE = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+) (\S+)`)

func TestUnitSecurityExposure(t *testing.T) {
	out, err := systemdAnalyze(t, "security", "--offline=true", unitFile)
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := exposureRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no overall exposure in:\n%s", out)
	}
	score, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exposure %.1f %s", score, m[2])
	if score >= maxExposure {
		t.Errorf("exposure %.1f, want below %.1f:\n%s", score, maxExposure, out)
	}
}

// unitSettings parses the [Service] section into key → values (a key may repeat).
func unitSettings(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	settings := map[string][]string{}
	section := ""
	for sc := bufio.NewScanner(f); sc.Scan(); {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#':
		case line[0] == '[':
			section = line
		case section == "[Service]":
			k, v, _ := strings.Cut(line, "=")
			settings[k] = append(settings[k], v)
		}
	}
	return settings
}

func TestUnitContract(t *testing.T) {
	s := unitSettings(t)
	for key, want := range map[string]string{
		"Type":             "notify",
		"NotifyAccess":     "main",
		"WatchdogSec":      "30",
		"Restart":          "on-failure",
		"KillMode":         "mixed",
		"Delegate":         "yes",
		"StateDirectory":   "sidecar",
		"RuntimeDirectory": "sidecar",
		"LoadCredential":   "auth-token:/etc/sidecar/auth-token",
		"OOMScoreAdjust":   "-900",
		"ProtectSystem":    "strict",
		"NoNewPrivileges":  "yes",
		"ExecReload":       "/bin/kill -HUP $MAINPID",
	} {
		if got := s[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s=%q, want %q", key, got, want)
		}
	}
	// Secrets never go through Environment=: `systemctl show` prints it to anyone.
	for _, env := range append(s["Environment"], s["PassEnvironment"]...) {
		if strings.Contains(env, "TOKEN") {
			t.Errorf("secret in the unit's environment: %q", env)
		}
	}
	// What the daemon needs must stay in the bounding set; what it does not, out.
	caps := strings.Fields(strings.Join(s["CapabilityBoundingSet"], " "))
	for _, c := range []string{"CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_FOWNER", "CAP_DAC_OVERRIDE", "CAP_KILL", "CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT"} {
		if !slices.Contains(caps, c) {
			t.Errorf("CapabilityBoundingSet lacks %s", c)
		}
	}
	for _, c := range []string{"CAP_SYS_PTRACE", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_NET_RAW", "CAP_MKNOD", "CAP_BPF"} {
		if slices.Contains(caps, c) {
			t.Errorf("CapabilityBoundingSet grants %s", c)
		}
	}
	// The helper installs a seccomp filter on every lease process (and the sandbox checks
	// at start that it can): the unit's own filter must let seccomp(2) through.
	if filter := strings.Join(s["SystemCallFilter"], " "); !slices.Contains(strings.Fields(filter), "seccomp") {
		t.Errorf("SystemCallFilter=%q lacks seccomp: every lease command would fail", filter)
	}
	// The unit may not make the cgroup tree read-only: lease cgroups are created there.
	if v := s["ProtectControlGroups"]; len(v) > 0 && v[0] != "no" {
		t.Errorf("ProtectControlGroups=%v would stop lease cgroups", v)
	}
	// Lease processes inherit the unit's system call filter (the VM's systemd variant runs
	// the suites under the unit): debuggers in a lease need ptrace.
	if !slices.Contains(strings.Fields(s["SystemCallFilter"][0]), "ptrace") {
		t.Errorf("SystemCallFilter=%s does not allow ptrace to lease processes", s["SystemCallFilter"][0])
	}
	for _, f := range s["SystemCallFilter"] {
		if deny, ok := strings.CutPrefix(f, "~"); ok && (slices.Contains(strings.Fields(deny), "@debug") || slices.Contains(strings.Fields(deny), "ptrace")) {
			t.Errorf("SystemCallFilter=%s refuses ptrace to lease processes", f)
		}
	}
	// Settings whose filters lease processes inherit and that break what leases do:
	// RestrictSUIDSGID= makes openat2 fail (leases in images), LockPersonality= refuses
	// linux32.
	for _, key := range []string{"RestrictSUIDSGID", "LockPersonality"} {
		if v := s[key]; len(v) > 0 && v[len(v)-1] != "no" {
			t.Errorf("%s=%v: see the unit's \"Options deliberately not set\"", key, v)
		}
	}
}

// daemonEnv lists the variables sidecar.env may set (docs/api.md, Configuration).
var daemonEnv = regexp.MustCompile(`^(SIDECAR_(LISTEN_ADDR|STATE_DIR|WORK_ROOT|TLS_CERT_FILE|TLS_KEY_FILE|TLS_CLIENT_CA_FILE|TLS_SELF_SIGNED|TLS_HOSTS|MAX_LEASES|LEASE_TTL|LEASE_MAX_TTL|DEFAULT_LIMITS_[A-Z_]+|CGROUP_PARENT|UID_RANGE|ISOLATION|SECCOMP|MAX_PTYS|ALLOWED_ORIGINS|LOG_LEVEL|LOG_FORMAT|IMAGES|DEFAULT_IMAGE|IMAGE_STORE_BYTES|ROOT_IMAGES|SNAPSHOT_MAX_AGE)|SCRIPT_ENABLED)$`)

func TestEnvExample(t *testing.T) {
	data, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(data), "\n") {
		// Settings and commented-out settings ("#KEY=…"); prose comments start "# ".
		line = strings.TrimPrefix(strings.TrimSpace(line), "#")
		k, _, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, " ") {
			continue
		}
		if !daemonEnv.MatchString(k) {
			t.Errorf("%s:%d: %s is not a daemon setting (secrets belong in credentials)", envFile, i+1, k)
		}
	}
}
