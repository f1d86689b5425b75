package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func validEnv() map[string]string {
	return map[string]string{
		"SIDECAR_AUTH_TOKEN":      strings.Repeat("t", 32),
		"SIDECAR_TLS_SELF_SIGNED": "true",
		"SIDECAR_STATE_DIR":       "/tmp/sidecar-state",
	}
}

func TestServeConfigDefaults(t *testing.T) {
	c, err := loadServeConfig(validEnv())
	if err != nil {
		t.Fatal(err)
	}
	if c.ListenAddr != "127.0.0.1:7443" || c.Isolation != "strict" || c.DiskQuota != "auto" || !c.ScriptEnabled || c.MaxLeases != 64 {
		t.Fatalf("defaults: %+v", c)
	}
	if c.WorkRoot != "/tmp/sidecar-state/leases" {
		t.Fatalf("work root %q", c.WorkRoot)
	}
	if c.CgroupParent != defaultCgroupParent("/tmp/sidecar-state") {
		t.Fatalf("cgroup parent %q, want the state dir's own", c.CgroupParent)
	}
	if c.DefaultLimits.MemoryBytes != 1<<30 || c.MaxLimits.Pids != 4096 {
		t.Fatalf("limits: %+v %+v", c.DefaultLimits, c.MaxLimits)
	}
	if c.MaxExecs != 16 || c.OutputBudgetBytes != 256<<20 {
		t.Fatalf("exec cap %d, output budget %d; want 16 and 256 MiB", c.MaxExecs, c.OutputBudgetBytes)
	}
	if c.MaxShells != 8 {
		t.Fatalf("shell sessions per lease %d, want 8", c.MaxShells)
	}
}

// Every bad variable is named, all at once, and no secret value is echoed.
func TestServeConfigReportsEveryProblem(t *testing.T) {
	env := map[string]string{
		"SIDECAR_AUTH_TOKEN":          "too-short-secret",
		"SIDECAR_MAX_LEASES":          "many",
		"SIDECAR_LEASE_TTL":           "forever",
		"SIDECAR_ISOLATION":           "partial",
		"SIDECAR_SECCOMP":             "relaxed",
		"SIDECAR_DISK_QUOTA":          "project",
		"SIDECAR_UID_RANGE":           "5-1",
		"SIDECAR_LOG_FORMAT":          "xml",
		"SIDECAR_DEFAULT_LIMITS_PIDS": "100000",
		// Under the kernel's 1 ms per 100 ms quota: every lease would fail at its cgroup.
		"SIDECAR_DEFAULT_LIMITS_CPU_MILLICORES": "1",
		"SIDECAR_SCRIPT_MAX_PER_LEASE":          "-1",
		"SIDECAR_MIN_LANDLOCK_ABI":              "9",
		"SIDECAR_REQUIRE_CGROUP":                "v3",
		"SIDECAR_OUTPUT_BUDGET_BYTES":           "1024",                        // below two full outputs
		"SIDECAR_LEASE_PATH":                    "/usr/local/go/bin::/usr/bin", // an empty entry
	}
	_, err := loadServeConfig(env)
	if err == nil {
		t.Fatal("bad config accepted")
	}
	msg := err.Error()
	for _, want := range []string{"SIDECAR_AUTH_TOKEN must be at least 32", "SIDECAR_MAX_LEASES", "SIDECAR_LEASE_TTL", "SIDECAR_ISOLATION", "SIDECAR_SECCOMP", "SIDECAR_DISK_QUOTA", "SIDECAR_UID_RANGE", "SIDECAR_LOG_FORMAT", "TLS is required", "SIDECAR_DEFAULT_LIMITS_PIDS",
		"SIDECAR_DEFAULT_LIMITS_CPU_MILLICORES must be at least 10", "SIDECAR_SCRIPT_MAX_PER_LEASE",
		"SIDECAR_MIN_LANDLOCK_ABI must be 0 to 7", "SIDECAR_REQUIRE_CGROUP must be v1, v2", "SIDECAR_OUTPUT_BUDGET_BYTES",
		"SIDECAR_LEASE_PATH \"/usr/local/go/bin::/usr/bin\" has an empty entry"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not name %s:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "too-short-secret") {
		t.Errorf("error echoes the token:\n%s", msg)
	}
}

func TestServeConfigTokenSources(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte(strings.Repeat("f", 40)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := validEnv()
	delete(env, "SIDECAR_AUTH_TOKEN")
	env["SIDECAR_AUTH_TOKEN_FILE"] = file
	c, err := loadServeConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	if c.SharedToken != strings.Repeat("f", 40) {
		t.Fatalf("token from file: %q", c.SharedToken)
	}

	env["SIDECAR_AUTH_TOKEN"] = strings.Repeat("e", 40)
	if _, err := loadServeConfig(env); err == nil || !strings.Contains(err.Error(), "exclude each other") {
		t.Fatalf("both token and token file: %v", err)
	}

	delete(env, "SIDECAR_AUTH_TOKEN")
	delete(env, "SIDECAR_AUTH_TOKEN_FILE")
	if _, err := loadServeConfig(env); err == nil || !strings.Contains(err.Error(), "SIDECAR_AUTH_TOKEN (or SIDECAR_AUTH_TOKEN_FILE) is required") {
		t.Fatalf("no token: %v", err)
	}
}

func TestServeConfigRefusesPlainHTTP(t *testing.T) {
	env := validEnv()
	delete(env, "SIDECAR_TLS_SELF_SIGNED")
	if _, err := loadServeConfig(env); err == nil || !strings.Contains(err.Error(), "TLS is required") {
		t.Fatalf("no TLS: %v", err)
	}
}

// Each state dir gets a cgroup parent of its own (so two daemons never sweep each other's
// leases); the service's keeps the name it always had.
func TestDefaultCgroupParent(t *testing.T) {
	svc, dev, dev2 := defaultCgroupParent("/var/lib/sidecar"), defaultCgroupParent("/root/src/sidecar/.state"), defaultCgroupParent("/home/me/sidecar/.state")
	if svc != "sidecar" || !strings.HasPrefix(dev, "sidecar-") || len(dev) != len("sidecar-")+8 || dev == dev2 {
		t.Fatalf("parents %q %q %q", svc, dev, dev2)
	}
	if again := defaultCgroupParent("/root/src/sidecar/.state/"); again != dev {
		t.Fatalf("the same dir gives %q and %q", dev, again)
	}
}
