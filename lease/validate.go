package lease

import (
	"fmt"

	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Bounds on request fields.
const (
	MaxSessionIDLen  = 128
	MaxLabels        = 32
	MaxLabelKeyLen   = 63
	MaxLabelValueLen = 256
)

// normalize checks r and fills its zero fields from the configuration.
func (c *Config) normalize(r Request) (Request, error) {
	if err := checkSessionID(r.SessionID); err != nil {
		return r, err
	}
	ttl, err := c.ttl(r.TTL)
	if err != nil {
		return r, err
	}
	r.TTL = ttl
	if r.Network.IsZero() {
		r.Network = c.DefaultNetwork
	}
	if err := c.checkNetwork(r.Network); err != nil {
		return r, err
	}
	if err := checkLabels(r.Labels); err != nil {
		return r, err
	}
	if r.Image, err = c.image(r.Image); err != nil {
		return r, err
	}
	r.Limits = fillLimits(r.Limits, c.DefaultLimits)
	if err := checkLimits(r.Limits, c.MaxLimits); err != nil {
		return r, err
	}
	return r, nil
}

// checkNetwork refuses a policy the daemon cannot enforce: an error that is both ErrInvalid
// and netpolicy.ErrInvalid, with netpolicy's message.
func (c *Config) checkNetwork(p netpolicy.Policy) error {
	check := netpolicy.CheckSyntax
	if c.CheckNetwork != nil {
		check = c.CheckNetwork
	}
	if err := check(p); err != nil {
		return invalidPolicy{err}
	}
	return nil
}

type invalidPolicy struct{ error }

func (e invalidPolicy) Unwrap() error      { return e.error }
func (invalidPolicy) Is(target error) bool { return target == ErrInvalid }

// image resolves a request's image name: the default for none, "" for the host's root.
func (c *Config) image(name string) (string, error) {
	if name == "" {
		name = c.DefaultImage
	}
	if name == "" || name == HostImage {
		return "", nil
	}
	if c.CheckImage == nil {
		return "", fmt.Errorf("%w: image %q: this daemon has no images (SIDECAR_IMAGES)", ErrInvalid, name)
	}
	if err := c.CheckImage(name); err != nil {
		return "", err
	}
	return name, nil
}

// ttl applies the default to a zero ttl and refuses one out of range.
func (c *Config) ttl(ttl time.Duration) (time.Duration, error) {
	switch {
	case ttl == 0:
		return c.DefaultTTL, nil
	case ttl < 0:
		return 0, fmt.Errorf("%w: ttl %v is negative", ErrInvalid, ttl)
	case ttl > c.MaxTTL:
		return 0, fmt.Errorf("%w: ttl %v over maximum %v", ErrInvalid, ttl, c.MaxTTL)
	}
	return ttl, nil
}

func checkSessionID(s string) error {
	n := utf8.RuneCountInString(s)
	if n == 0 || n > MaxSessionIDLen {
		return fmt.Errorf("%w: session id must be 1 to %d characters", ErrInvalid, MaxSessionIDLen)
	}
	if !printable(s) || strings.ContainsRune(s, '/') {
		return fmt.Errorf("%w: session id must be printable and contain no '/'", ErrInvalid)
	}
	return nil
}

func checkLabels(labels map[string]string) error {
	if len(labels) > MaxLabels {
		return fmt.Errorf("%w: %d labels, at most %d", ErrInvalid, len(labels), MaxLabels)
	}
	for k, v := range labels {
		if k == "" || len(k) > MaxLabelKeyLen || !printable(k) {
			return fmt.Errorf("%w: label key must be 1 to %d printable bytes", ErrInvalid, MaxLabelKeyLen)
		}
		if len(v) > MaxLabelValueLen || !printable(v) {
			return fmt.Errorf("%w: label %q: value must be at most %d printable bytes", ErrInvalid, k, MaxLabelValueLen)
		}
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control or other unprintable runes.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// fillLimits replaces the zero fields of l with those of def.
func fillLimits(l, def Limits) Limits {
	fill := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	fill(&l.MemoryBytes, def.MemoryBytes)
	fill(&l.CPUMillicores, def.CPUMillicores)
	fill(&l.Pids, def.Pids)
	fill(&l.DiskBytes, def.DiskBytes)
	return l
}

// What the kernel can enforce of a lease's limits; 0 means no limit. Every limit is
// checked against these before a directory, disk or cgroup is made, so a request the
// kernel would refuse is a 400, never a half-made lease or a 500.
const (
	// MinMemoryBytes: a memory cgroup below it cannot start the lease's first process.
	MinMemoryBytes = 4 << 20
	// MinCPUMillicores: the CFS quota is at least 1 ms of each 100 ms period.
	MinCPUMillicores = 10
	// MaxCPUMillicores: 1,024 cores.
	MaxCPUMillicores = 1024 * 1000
	// MaxPids is the kernel's own ceiling on pids (PID_MAX_LIMIT).
	MaxPids = 1 << 22
)

// checkLimits refuses negative fields, fields outside what the kernel can enforce and
// fields over a non-zero configured maximum.
func checkLimits(l, maxLimits Limits) error {
	for _, f := range []struct {
		name           string
		v, floor, ceil int64
		configured     int64
	}{
		{"memory_bytes", l.MemoryBytes, MinMemoryBytes, 0, maxLimits.MemoryBytes},
		{"cpu_millicores", l.CPUMillicores, MinCPUMillicores, MaxCPUMillicores, maxLimits.CPUMillicores},
		{"pids", l.Pids, 0, MaxPids, maxLimits.Pids},
		{"disk_bytes", l.DiskBytes, 0, 0, maxLimits.DiskBytes},
	} {
		switch {
		case f.v < 0:
			return fmt.Errorf("%w: %s %d is negative", ErrInvalid, f.name, f.v)
		case f.v > 0 && f.v < f.floor:
			return fmt.Errorf("%w: %s %d under the minimum %d (0: the default)", ErrInvalid, f.name, f.v, f.floor)
		case f.ceil > 0 && f.v > f.ceil:
			return fmt.Errorf("%w: %s %d over the kernel's maximum %d", ErrInvalid, f.name, f.v, f.ceil)
		case f.configured > 0 && f.v > f.configured:
			return fmt.Errorf("%w: %s %d over maximum %d", ErrInvalid, f.name, f.v, f.configured)
		}
	}
	return nil
}
