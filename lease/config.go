package lease

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/sidecar-sandbox/sidecar/fsxfer"
	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
)

// Defaults for zero Config fields.
const (
	DefaultTTL       = 15 * time.Minute
	DefaultMaxTTL    = 24 * time.Hour
	DefaultMaxLeases = 64
)

// Provisioner sets up and tears down what the lease package does not own (cgroup, chown of
// work/ and tmp/ to the lease uid, network namespace). Provision must be idempotent: it is
// called again for every active lease when the daemon restarts. Teardown must be idempotent
// too and cope with a lease that was never (or only partly) provisioned: it runs when
// Provision fails, again when a failed release is retried, and for leases that expired
// while the daemon was down. When it returns, the lease's processes are killed: none runs
// another instruction of its own.
//
// Retire removes what Teardown leaves for later, off the request path (their exits,
// cgroups, mounts): it runs after Teardown, once the journal says the lease is gone, right
// before its directory is removed, and again with that removal's retries; so it too must
// be idempotent. What it leaves on a crash is the next start's to sweep.
type Provisioner interface {
	Provision(ctx context.Context, l Lease) error
	Teardown(ctx context.Context, l Lease) error
	Retire(ctx context.Context, l Lease) error
}

// Config configures a Manager. StateDir and WorkRoot are required.
type Config struct {
	StateDir, WorkRoot string
	DefaultTTL, MaxTTL time.Duration // defaults 15m and 24h if zero
	MaxLeases          int           // default 64
	// Spares is how many leases Run keeps made ahead for requests of the default shape
	// (spare.go); 0: none.
	Spares int
	// SpareCurrent says whether a spare still gets what a lease made now would (the
	// daemon: its image was not replaced since); nil: always.
	SpareCurrent func(Lease) bool
	// DefaultLimits fill a request's zero fields; a request field over the matching
	// MaxLimits field is ErrInvalid. A zero MaxLimits field means no maximum.
	DefaultLimits, MaxLimits Limits
	// UIDFirst..UIDLast: both 0 means no uid allocation; otherwise every lease gets one
	// free uid (gid = uid) from the range, and ErrLimit when it is used up.
	UIDFirst, UIDLast int
	// UIDOwners is where running daemons record their uid ranges (uidrange.go); default
	// DefaultUIDOwners.
	UIDOwners   string
	Provisioner Provisioner      // nil: none
	Now         func() time.Time // default time.Now
	Logger      *slog.Logger     // default: discard
	// OnEvent is the audit and metrics hook, called after each state change, outside any
	// lock. It must not block for long.
	OnEvent func(Event)
	// RemoveDir removes a lease directory tree; default fsxfer.RemoveTree, which never
	// crosses a mount point or follows a symlink.
	RemoveDir func(dir string) error
	// Disk gives each lease directory a filesystem bounded by Limits.DiskBytes; nil: none.
	Disk Disk
	// DefaultNetwork is the policy of a request without one; zero: egress internet.
	DefaultNetwork netpolicy.Policy
	// CheckNetwork validates a policy against the daemon's deny set (lease/network);
	// nil checks the egress mode only.
	CheckNetwork func(netpolicy.Policy) error
	// DefaultImage is the image of a request without one; "" or HostImage: the host's
	// root filesystem.
	DefaultImage string
	// CheckImage says whether a new lease may run on the named image now (lease/image's
	// Store.Check); its error is returned as it is. nil: no image but the host's.
	CheckImage func(name string) error
}

// NetworkSetter is a Provisioner that also applies a replaced network policy to a running
// lease (Manager.SetNetwork).
type NetworkSetter interface {
	SetNetwork(ctx context.Context, l Lease) error
}

// Disk bounds a lease directory's size with the kernel (lease/disk). The lease package
// calls Attach on a new, empty directory before making anything in it (and again after a
// restart, which must adopt what is there), and Detach before removing a directory: a
// directory Detach fails on is never removed.
type Disk interface {
	Attach(ctx context.Context, dir string, bytes int64) error
	Detach(ctx context.Context, dir string) error
	// Sweep detaches what belongs to leases that owns does not know, and returns their ids.
	Sweep(ctx context.Context, owns func(id string) bool) ([]string, error)
}

// withDefaults fills zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		return c, fmt.Errorf("lease: StateDir must be an absolute path, got %q", c.StateDir)
	}
	if c.WorkRoot == "" || !filepath.IsAbs(c.WorkRoot) {
		return c, fmt.Errorf("lease: WorkRoot must be an absolute path, got %q", c.WorkRoot)
	}
	c.StateDir, c.WorkRoot = filepath.Clean(c.StateDir), filepath.Clean(c.WorkRoot)
	if c.DefaultTTL == 0 {
		c.DefaultTTL = DefaultTTL
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = DefaultMaxTTL
	}
	if c.UIDOwners == "" {
		c.UIDOwners = DefaultUIDOwners
	}
	if c.DefaultNetwork.IsZero() {
		c.DefaultNetwork = netpolicy.Policy{Egress: netpolicy.EgressInternet}
	}
	if c.DefaultTTL < 0 || c.MaxTTL < c.DefaultTTL {
		return c, fmt.Errorf("lease: need 0 < DefaultTTL (%v) <= MaxTTL (%v)", c.DefaultTTL, c.MaxTTL)
	}
	if c.MaxLeases == 0 {
		c.MaxLeases = DefaultMaxLeases
	}
	if c.MaxLeases < 0 {
		return c, fmt.Errorf("lease: MaxLeases must be positive, got %d", c.MaxLeases)
	}
	if c.Spares < 0 || c.Spares > c.MaxLeases {
		return c, fmt.Errorf("lease: Spares must be 0 to MaxLeases (%d), got %d", c.MaxLeases, c.Spares)
	}
	if err := checkLimits(c.DefaultLimits, c.MaxLimits); err != nil {
		return c, fmt.Errorf("lease: DefaultLimits: %w", err)
	}
	if c.UIDFirst != 0 || c.UIDLast != 0 {
		// uid 0 is root: a range that includes it would hand a lease root.
		if c.UIDFirst <= 0 || c.UIDLast < c.UIDFirst {
			return c, fmt.Errorf("lease: uid range %d-%d: need 0 < first <= last", c.UIDFirst, c.UIDLast)
		}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.OnEvent == nil {
		c.OnEvent = func(Event) {}
	}
	if c.RemoveDir == nil {
		c.RemoveDir = fsxfer.RemoveTree
	}
	return c, nil
}
