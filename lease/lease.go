package lease

import (
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
)

// Limits bound one lease. Zero in a Request means "the configured default".
type Limits struct {
	MemoryBytes   int64 `env:"MEMORY_BYTES"` // the env tags name cmd/sidecar's SIDECAR_{DEFAULT,MAX}_LIMITS_*
	CPUMillicores int64 `env:"CPU_MILLICORES"`
	Pids          int64 `env:"PIDS"`
	DiskBytes     int64 `env:"DISK_BYTES"`
}

// Lease is one session's sandbox. It is a value: the Manager hands out copies.
type Lease struct {
	ID, SessionID string
	Labels        map[string]string
	Network       netpolicy.Policy // where its connections may go
	// Image names the operator's image (lease/image) the lease runs on; "": the host's
	// root filesystem.
	Image    string
	Limits   Limits
	UID, GID int // 0: no per-lease uid
	// Dir is WorkRoot/ID, mode 0711 and owned by the daemon. It holds work/ (0700, the
	// workdir), tmp/ (0700, the lease's private /tmp), home/ (its home tree) and uploads/
	// (0700, partial uploads, daemon only). The Provisioner chowns work/ and tmp/ to the
	// lease uid and makes home/ its own.
	Dir                                  string
	CreatedAt, ExpiresAt, LastActivityAt time.Time
}

// Workdir is the directory the lease's processes and file operations are confined to.
func (l Lease) Workdir() string { return filepath.Join(l.Dir, "work") }

// TmpDir is the lease's private /tmp.
func (l Lease) TmpDir() string { return filepath.Join(l.Dir, "tmp") }

// HomeDir is the lease's home tree: the sandbox binds it on /home, where the lease's HOME
// is, so that tool caches and dotfiles stay out of the workdir (and inside the quota).
func (l Lease) HomeDir() string { return filepath.Join(l.Dir, "home") }

// UploadsDir holds partial uploads; only the daemon touches it.
func (l Lease) UploadsDir() string { return filepath.Join(l.Dir, "uploads") }

// Active reports whether the lease has not expired at now.
func (l Lease) Active(now time.Time) bool { return now.Before(l.ExpiresAt) }

// clone returns a copy that shares no map with l.
func (l Lease) clone() Lease {
	l.Labels = maps.Clone(l.Labels)
	l.Network.AllowOut = slices.Clone(l.Network.AllowOut)
	l.Network.DenyOut = slices.Clone(l.Network.DenyOut)
	return l
}

// Request asks for a lease. Zero fields take the configured defaults.
type Request struct {
	SessionID string
	TTL       time.Duration
	Limits    Limits
	Network   netpolicy.Policy // zero: Config.DefaultNetwork
	Labels    map[string]string
	// Image is an image name of the operator's; "": Config.DefaultImage; HostImage:
	// the host's root filesystem.
	Image string
}

// HostImage is the image name of the host's own root filesystem (a lease's Image "").
const HostImage = "host"

// Event kinds passed to Config.OnEvent.
const (
	EventCreated  = "created"
	EventRenewed  = "renewed"
	EventReleased = "released"
	EventExpired  = "expired"
)

// Event reports a lease state change, after it happened.
type Event struct {
	Kind  string // EventCreated, EventRenewed, EventReleased or EventExpired
	Lease Lease
}
