package daemon

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/confine"
	"github.com/sidecar-sandbox/sidecar/internal/process"
	"github.com/sidecar-sandbox/sidecar/internal/sandbox"
	"github.com/sidecar-sandbox/sidecar/lease"
	"github.com/sidecar-sandbox/sidecar/sidecar"
)

// Config is the daemon's whole configuration. cmd/sidecar reads it from the environment,
// starting from ServeDefaults: the env tags name the variables (docs/api.md,
// Configuration) and hold the other defaults of `sidecar serve`; Check owns the rules, and
// Start and the packages below trust what they get. A Config built in Go (tests) takes the
// zero values, which each part reads as its own default.
type Config struct {
	Version       string
	SharedToken   string `env:"SIDECAR_AUTH_TOKEN"`          // ≥ apitype.MinTokenLength characters
	PreviousToken string `env:"SIDECAR_AUTH_TOKEN_PREVIOUS"` // accepted during a rotation; "" when none
	ListenAddr    string `env:"SIDECAR_LISTEN_ADDR" envDefault:"127.0.0.1:7443"`
	TLS           *tls.Config
	CertNotAfter  func() time.Time

	StateDir string `env:"SIDECAR_STATE_DIR"`
	WorkRoot string `env:"SIDECAR_WORK_ROOT"`

	MaxLeases         int           `env:"SIDECAR_MAX_LEASES" envDefault:"64"`
	LeaseSpares       int           `env:"SIDECAR_LEASE_SPARES" envDefault:"1"` // leases of the default shape made ahead (lease/spare.go); 0 none
	DefaultTTL        time.Duration `env:"SIDECAR_LEASE_TTL" envDefault:"15m"`
	MaxTTL            time.Duration `env:"SIDECAR_LEASE_MAX_TTL" envDefault:"24h"`
	DefaultLimits     lease.Limits  `envPrefix:"SIDECAR_DEFAULT_LIMITS_"`
	MaxLimits         lease.Limits  `envPrefix:"SIDECAR_MAX_LIMITS_"`
	UIDFirst, UIDLast int
	CgroupParent      string `env:"SIDECAR_CGROUP_PARENT"`
	Isolation         string `env:"SIDECAR_ISOLATION" envDefault:"strict"`   // "strict" or "none"
	Seccomp           string `env:"SIDECAR_SECCOMP" envDefault:"strict"`     // "strict" or "off": the system-call filter on lease processes and script workers
	MinLandlockABI    int    `env:"SIDECAR_MIN_LANDLOCK_ABI" envDefault:"0"` // operator's floor: refuse to start below it; 0 none
	RequireCgroup     string `env:"SIDECAR_REQUIRE_CGROUP"`                  // operator's floor: "v1", "v2" or "" (either)
	// LeasePath extends lease processes' PATH: directories after sandbox.DefaultPath,
	// ':'-separated (sandbox.LeasePathDirs says which are accepted).
	LeasePath      string `env:"SIDECAR_LEASE_PATH"`
	LandlockMaxABI int    // caps the Landlock ABI lease processes get (tests); 0 the kernel's
	// DiskQuota is how lease disk limits are enforced: "auto" (default: a loop-mounted
	// filesystem per lease when the host allows, else refuse in strict isolation), "loop"
	// or "off" (the API meter only). See lease/disk.
	DiskQuota      string   `env:"SIDECAR_DISK_QUOTA" envDefault:"auto"`
	AllowedOrigins []string `env:"SIDECAR_ALLOWED_ORIGINS" envSeparator:","`
	// Console serves the operator console at /ui/ (docs/operations.md).
	Console bool `env:"SIDECAR_CONSOLE"`

	// CapacityMemoryBytes is the memory all leases may commit, reported in GET /v1/info
	// for placement across sidecars; 0: the host's MemTotal.
	CapacityMemoryBytes int64 `env:"SIDECAR_CAPACITY_MEMORY_BYTES"`

	MaxOutputBytes    int64 `env:"SIDECAR_MAX_OUTPUT_BYTES" envDefault:"1048576"`      // run-to-completion output cap per stream
	OutputBufferBytes int64 `env:"SIDECAR_OUTPUT_BUFFER_BYTES" envDefault:"1048576"`   // replay buffer per background process
	MaxProcesses      int   `env:"SIDECAR_MAX_PROCESSES" envDefault:"64"`              // background processes per lease
	MaxPTYs           int   `env:"SIDECAR_MAX_PTYS" envDefault:"64"`                   // PTYs per lease (its own devpts instance); 0 sandbox.DefaultMaxPTYs
	MaxExecs          int   `env:"SIDECAR_MAX_EXECS_PER_LEASE" envDefault:"16"`        // run-to-completion execs per lease at once
	OutputBudgetBytes int64 `env:"SIDECAR_OUTPUT_BUDGET_BYTES" envDefault:"268435456"` // output all execs and shell commands hold in memory, daemon-wide
	MaxShells         int   `env:"SIDECAR_MAX_SHELLS_PER_LEASE" envDefault:"8"`        // shell sessions per lease
	MaxSearches       int   `env:"SIDECAR_MAX_SEARCHES" envDefault:"16"`               // greps running at once, daemon-wide (4 per lease)
	SearchBudgetBytes int64 `env:"SIDECAR_SEARCH_BUDGET_BYTES" envDefault:"268435456"` // memory all greps hold at once, daemon-wide

	Network NetworkConfig
	Images  ImageConfig

	ScriptEnabled bool `env:"SCRIPT_ENABLED" envDefault:"true"`
	ScriptWorkers int  `env:"SIDECAR_SCRIPT_WORKERS" envDefault:"2"`
	// ScriptMaxPerLease is how many script workers one lease's scripts hold at once; 0:
	// half the workers, at least 1.
	ScriptMaxPerLease int `env:"SIDECAR_SCRIPT_MAX_PER_LEASE" envDefault:"0"`

	HelperPath   string // the daemon binary, run as the script worker (and the sandbox helper when no sidecar-init sits beside it); default os.Executable()
	HTTP         sidecar.HTTPLimits
	ReapInterval time.Duration // default 10s
	UploadIdle   time.Duration // partial uploads idle this long are reaped; default 24h

	Now    func() time.Time
	Logger *slog.Logger
}

// ServeDefaults is the configuration `sidecar serve` reads the environment into: the
// lease limits' defaults, which two variable prefixes share a type for (the env tags hold
// the others).
func ServeDefaults() Config {
	return Config{
		DefaultLimits: lease.Limits{MemoryBytes: 1 << 30, CPUMillicores: 1000, Pids: 512, DiskBytes: 10 << 30},
		MaxLimits:     lease.Limits{MemoryBytes: 8 << 30, CPUMillicores: 4000, Pids: 4096, DiskBytes: 100 << 30},
	}
}

// ConfigError is one setting that breaks a rule: the variable that sets it and what is
// wrong with it. Values of secrets never appear in it.
type ConfigError struct {
	Var     string // the environment variable, SIDECAR_MAX_LEASES say
	Problem string // what is wrong, and what to set instead
}

func (e *ConfigError) Error() string { return e.Var + " " + e.Problem }

// Check reports every rule c breaks, each a *ConfigError, all at once.
func (c *Config) Check() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, &ConfigError{Var: name, Problem: fmt.Sprintf(format, args...)})
	}
	switch n := len(c.SharedToken); {
	case n == 0:
		bad("SIDECAR_AUTH_TOKEN", "(or SIDECAR_AUTH_TOKEN_FILE) is required: make one with `sidecar token`")
	case n < apitype.MinTokenLength:
		bad("SIDECAR_AUTH_TOKEN", "must be at least %d characters (it has %d): make one with `sidecar token`", apitype.MinTokenLength, n)
	}
	if n := len(c.PreviousToken); n > 0 && n < apitype.MinTokenLength {
		bad("SIDECAR_AUTH_TOKEN_PREVIOUS", "must be at least %d characters (it has %d)", apitype.MinTokenLength, n)
	}
	if _, _, err := net.SplitHostPort(c.ListenAddr); err != nil {
		bad("SIDECAR_LISTEN_ADDR", "must be HOST:PORT: %v", err)
	}
	if c.Isolation != sandbox.IsolationStrict && c.Isolation != sandbox.IsolationNone {
		bad("SIDECAR_ISOLATION", "must be strict or none, not %q", c.Isolation)
	}
	if c.DiskQuota != "auto" && c.DiskQuota != "loop" && c.DiskQuota != "off" {
		bad("SIDECAR_DISK_QUOTA", "must be auto, loop or off, not %q", c.DiskQuota)
	}
	if c.MinLandlockABI < 0 || c.MinLandlockABI > sandbox.MaxKnownLandlockABI {
		bad("SIDECAR_MIN_LANDLOCK_ABI", "must be 0 to %d, not %d", sandbox.MaxKnownLandlockABI, c.MinLandlockABI)
	}
	if c.CgroupParent != "" && !confine.ValidParent(c.CgroupParent) {
		bad("SIDECAR_CGROUP_PARENT", "must be a relative cgroup path of names (letters, digits, '_' and '-', starting with a letter or digit), not %q", c.CgroupParent)
	}
	if c.RequireCgroup != "" && c.RequireCgroup != "v1" && c.RequireCgroup != "v2" {
		bad("SIDECAR_REQUIRE_CGROUP", "must be v1, v2 or empty, not %q", c.RequireCgroup)
	}
	if c.MaxPTYs < 1 || c.MaxPTYs > 4096 {
		bad("SIDECAR_MAX_PTYS", "must be 1 to 4096, not %d", c.MaxPTYs)
	}
	if c.Seccomp != sandbox.SeccompStrict && c.Seccomp != sandbox.SeccompOff {
		bad("SIDECAR_SECCOMP", "must be strict or off, not %q", c.Seccomp)
	}
	if _, err := sandbox.LeasePathDirs(c.LeasePath); err != nil {
		_, problem, _ := strings.Cut(err.Error(), "SIDECAR_LEASE_PATH ")
		bad("SIDECAR_LEASE_PATH", "%s", problem)
	}
	if c.MaxLeases < 1 {
		bad("SIDECAR_MAX_LEASES", "must be at least 1")
	}
	if c.LeaseSpares < 0 || c.LeaseSpares > c.MaxLeases {
		bad("SIDECAR_LEASE_SPARES", "must be 0 to SIDECAR_MAX_LEASES (%d), not %d", c.MaxLeases, c.LeaseSpares)
	}
	if c.CapacityMemoryBytes < 0 {
		bad("SIDECAR_CAPACITY_MEMORY_BYTES", "must not be negative (0 or unset: the host's MemTotal)")
	}
	if c.DefaultTTL <= 0 || c.MaxTTL < c.DefaultTTL {
		bad("SIDECAR_LEASE_TTL", "must be positive and at most SIDECAR_LEASE_MAX_TTL")
	}
	def, max := c.DefaultLimits, c.MaxLimits
	for _, l := range []struct {
		name             string
		def, max_, floor int64
	}{
		{"MEMORY_BYTES", def.MemoryBytes, max.MemoryBytes, lease.MinMemoryBytes},
		{"CPU_MILLICORES", def.CPUMillicores, max.CPUMillicores, lease.MinCPUMillicores},
		{"PIDS", def.Pids, max.Pids, 1},
		{"DISK_BYTES", def.DiskBytes, max.DiskBytes, 1},
	} {
		if l.def < l.floor || l.def > l.max_ {
			bad("SIDECAR_DEFAULT_LIMITS_"+l.name, "must be at least %d and at most SIDECAR_MAX_LIMITS_%s", l.floor, l.name)
		}
	}
	if c.ScriptMaxPerLease < 0 {
		bad("SIDECAR_SCRIPT_MAX_PER_LEASE", "must not be negative (0: half of SIDECAR_SCRIPT_WORKERS)")
	}
	if c.MaxOutputBytes < 1024 {
		bad("SIDECAR_MAX_OUTPUT_BYTES", "must be at least 1024")
	}
	if c.OutputBufferBytes < process.MinBufferBytes {
		bad("SIDECAR_OUTPUT_BUFFER_BYTES", "must be at least %d (two reads of a process's output)", process.MinBufferBytes)
	}
	if c.MaxExecs < 1 {
		bad("SIDECAR_MAX_EXECS_PER_LEASE", "must be positive")
	}
	if c.OutputBudgetBytes < 2*c.MaxOutputBytes {
		bad("SIDECAR_OUTPUT_BUDGET_BYTES", "must be at least twice SIDECAR_MAX_OUTPUT_BYTES")
	}
	if c.MaxSearches < 1 {
		bad("SIDECAR_MAX_SEARCHES", "must be positive")
	}
	if c.SearchBudgetBytes < 1<<20 {
		bad("SIDECAR_SEARCH_BUDGET_BYTES", "must be at least 1048576 (1 MiB)")
	}
	if c.MaxShells < 1 {
		bad("SIDECAR_MAX_SHELLS_PER_LEASE", "must be positive")
	}
	return errors.Join(errs...)
}
