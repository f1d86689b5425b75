package daemon

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// Check reports each broken rule as a *ConfigError naming its variable, all at once, and
// never a secret's value.
func TestConfigCheckNamesEachVariable(t *testing.T) {
	c := ServeDefaults()
	c.SharedToken = "short-secret-value"
	c.PreviousToken = "old"
	c.ListenAddr = "nowhere"
	c.Isolation, c.Seccomp, c.DiskQuota = "partial", "relaxed", "project"
	c.DefaultLimits.MemoryBytes = 1 << 20 // below lease.MinMemoryBytes
	c.CgroupParent, c.RequireCgroup, c.MinLandlockABI = "../host", "v3", 99
	err := c.Check()
	var got []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ce *ConfigError
		if !errors.As(e, &ce) {
			t.Fatalf("%v is not a *ConfigError", e)
		}
		if !strings.HasPrefix(ce.Error(), ce.Var+" ") {
			t.Errorf("%q does not start with its variable %s", ce.Error(), ce.Var)
		}
		got = append(got, ce.Var)
	}
	for _, want := range []string{"SIDECAR_AUTH_TOKEN", "SIDECAR_AUTH_TOKEN_PREVIOUS", "SIDECAR_LISTEN_ADDR", "SIDECAR_ISOLATION",
		"SIDECAR_SECCOMP", "SIDECAR_DISK_QUOTA", "SIDECAR_DEFAULT_LIMITS_MEMORY_BYTES", "SIDECAR_MAX_LEASES",
		"SIDECAR_CGROUP_PARENT", "SIDECAR_REQUIRE_CGROUP", "SIDECAR_MIN_LANDLOCK_ABI"} {
		if !slices.Contains(got, want) {
			t.Errorf("no error names %s: %v", want, err)
		}
	}
	if strings.Contains(err.Error(), "short-secret-value") || strings.Contains(err.Error(), `"old"`) {
		t.Errorf("a token's value in %v", err)
	}
}
