// Package apitype holds the sidecar wire contract: request and response bodies, route and
// header names, error codes and websocket channel bytes. The daemon and the client both
// import it, so it depends on the standard library only.
package apitype

import (
	"encoding/json"
	"time"
)

// Version of the wire contract. The route prefix carries the major version.
const APIVersion = "v1"

// Workspace is the lease workdir's absolute name: lease processes see their workdir there
// (strict isolation), lease info reports it, and every path of the file routes and exec's
// cwd may be relative to it or absolute under it.
const Workspace = "/workspace"

// MinTokenLength is the shortest shared token (SIDECAR_AUTH_TOKEN, SANDBOX_REMOTE_AUTH_TOKEN)
// the daemon starts with and the client accepts.
const MinTokenLength = 32

// Routes, as Go 1.22 ServeMux patterns without the method.
const (
	RouteHealthz        = "/healthz"
	RouteReadyz         = "/readyz"
	RouteDrain          = "/v1/drain"
	RouteMetrics        = "/metrics"
	RouteInfo           = "/v1/info"
	RouteLeases         = "/v1/leases"
	RouteLease          = "/v1/leases/{id}"
	RouteLeaseRenew     = "/v1/leases/{id}/renew"
	RouteCleanup        = "/v1/cleanup"
	RouteImages         = "/v1/images"
	RouteImage          = "/v1/images/{name}"
	RouteImagePull      = "/v1/images/{name}/pull"
	RouteExec           = "/v1/leases/{id}/exec"
	RouteProcesses      = "/v1/leases/{id}/processes"
	RouteProcess        = "/v1/leases/{id}/processes/{pid}"
	RouteProcessSignal  = "/v1/leases/{id}/processes/{pid}/signal"
	RouteProcessAttach  = "/v1/leases/{id}/processes/{pid}/attach"
	RouteShells         = "/v1/leases/{id}/shells"
	RouteShell          = "/v1/leases/{id}/shells/{sid}"
	RouteShellRun       = "/v1/leases/{id}/shells/{sid}/run"
	RouteLeftoverSignal = "/v1/leases/{id}/leftovers/{pid}/signal"
	RouteFiles          = "/v1/leases/{id}/files/{path...}"
	RouteArchive        = "/v1/leases/{id}/archive/{path...}"
	RouteLeaseUsage     = "/v1/leases/{id}/usage"
	RouteLeaseNetwork   = "/v1/leases/{id}/network"
	RoutePorts          = "/v1/leases/{id}/ports/{port}/{path...}"
	RoutePortForward    = "/v1/leases/{id}/port-forward/{port}"
	// PortForwardProtocol is the websocket subprotocol of RoutePortForward: binary
	// messages carry the TCP stream, both ways.
	PortForwardProtocol     = "sidecar.port-forward.v1"
	RouteScriptsRun         = "/v1/scripts/run"
	ProblemContentType      = "application/problem+json"
	ProblemTypePrefix       = "https://sidecar.dev/problems/"
	BearerScheme            = "Bearer"
	BearerSubprotocolPrefix = "base64url.bearer.authorization.k8s.io."
)

// Headers.
const (
	HeaderAuthorization   = "Authorization"
	HeaderWWWAuthenticate = "WWW-Authenticate"
	HeaderOrigin          = "Origin"
	HeaderContentDigest   = "Content-Digest"
	// HeaderReprDigest (RFC 9530) on the last PATCH of a resumable upload: the digest of
	// the whole file, checked before the file appears.
	HeaderReprDigest     = "Repr-Digest"
	HeaderFileMode       = "X-File-Mode"
	HeaderFileType       = "X-File-Type"
	HeaderFileSize       = "X-File-Size"
	HeaderFileMtime      = "X-File-Mtime"
	HeaderLinkTarget     = "X-Symlink-Target"
	HeaderUploadOffset   = "Upload-Offset"
	HeaderUploadComplete = "Upload-Complete"
	HeaderUploadLength   = "Upload-Length"
	HeaderRequestID      = "X-Request-Id"
	// HeaderLeaseToken, on a reply to a lease-token request: a fresh lease token, sent
	// when the lease was renewed past the expiry of the token the request carried.
	HeaderLeaseToken = "X-Lease-Token"
	// HeaderBytesLost, on a websocket attach's 101 response: how many bytes of the requested
	// range had already left the replay buffer.
	HeaderBytesLost = "X-Output-Bytes-Lost"
	// HeaderOutputOffset, on a websocket attach's 101 response: the offset of the first
	// output byte this attachment will deliver.
	HeaderOutputOffset = "X-Output-Offset"
	// HeaderOutputMode, on a websocket attach's 101 response: OutputModeLossless when the
	// daemon holds the process for this viewer (?lossless=1), OutputModeLossy otherwise. A
	// daemon that predates lossless attach sends no header.
	HeaderOutputMode = "X-Output-Mode"
	// HeaderProcessID, on the GET …/exec websocket's 101 response: the daemon's process id,
	// for a later attach.
	HeaderProcessID = "X-Process-Id"
)

// Error codes: the stable "code" member of every problem+json body.
const (
	CodeUnauthorized       = "unauthorized"
	CodeForbidden          = "forbidden"
	CodeInvalidRequest     = "invalid_request"
	CodeNotFound           = "not_found"
	CodeLeaseNotFound      = "lease_not_found"
	CodeLeaseExpired       = "lease_expired"
	CodeLeaseLimit         = "lease_limit"
	CodeExecLimit          = "exec_limit"
	CodeProcessNotFound    = "process_not_found"
	CodePathOutsideWorkdir = "path_outside_workdir"
	CodeNotADirectory      = "not_a_directory"
	CodeIsADirectory       = "is_a_directory"
	CodeExists             = "exists"
	CodeQuotaExceeded      = "quota_exceeded"
	CodeDigestMismatch     = "digest_mismatch"
	CodePayloadTooLarge    = "payload_too_large"
	CodeCapabilityDisabled = "capability_disabled"
	CodeScriptError        = "script_error"
	CodeScriptTimeout      = "script_timeout"
	CodeUnavailable        = "unavailable"
	CodeInternal           = "internal"
	// Codes added beyond the v1 table, for cases it does not name.
	CodeMethodNotAllowed   = "method_not_allowed"
	CodeHeaderTooLarge     = "header_too_large"
	CodeConflict           = "conflict"
	CodeRangeUnsatisfied   = "range_not_satisfiable"
	CodePreconditionFailed = "precondition_failed"
	// CodeOldTextNotFound and CodeOldTextNotUnique (409): an exact replacement found its
	// old text nowhere, or more than once without "all".
	CodeOldTextNotFound  = "old_text_not_found"
	CodeOldTextNotUnique = "old_text_not_unique"
	// CodeSandboxSetupFailed (500): a step of the lease's sandbox (cgroup join, mount, uid
	// drop, Landlock, seccomp…) failed before the command ran; the detail names the step.
	CodeSandboxSetupFailed = "sandbox_setup_failed"
	// CodeDraining (503): the daemon is draining and takes no new lease; a session's
	// existing lease is still returned, and every other call on a lease still works.
	// A fleet client places the new lease on another sidecar.
	CodeDraining = "draining"
	// CodeShellNotFound (404): no such shell session in the lease, or its shell ended.
	CodeShellNotFound = "shell_not_found"
	// CodeShellBusy (409): the shell session is running a command; sessions run one at a
	// time (open another session for parallel work).
	CodeShellBusy = "shell_busy"
	// CodeInvalidNetworkPolicy: a network policy the daemon refuses (an entry it cannot
	// read, or one in the deny set that only SIDECAR_NETWORK_PRIVATE_ALLOW opens).
	CodeInvalidNetworkPolicy = "invalid_network_policy"
	// CodePortUnreachable: nothing listens on that port inside the lease.
	CodePortUnreachable = "port_unreachable"
	// CodeSearchLimit (429): a grep refused because the lease (4) or the daemon
	// (SIDECAR_MAX_SEARCHES) runs as many searches at once as it may, or the daemon's
	// search memory budget (SIDECAR_SEARCH_BUDGET_BYTES) cannot hold its pattern.
	CodeSearchLimit = "search_limit"
	// CodePatternTooComplex (400): a grep pattern whose compiled program is over 10,000
	// instructions (a counted repetition counts each copy).
	CodePatternTooComplex = "pattern_too_complex"
	// CodeWatchLimit (429): a watch refused because the lease or the daemon holds all the
	// inotify instances or watches its budget allows (the daemon's is a quarter of the
	// host's per-user limits), or the host refused one.
	CodeWatchLimit = "watch_limit"
	// CodeUnknownImage (400): an acquire names an image that is not one of the
	// operator's (SIDECAR_IMAGES; GET /v1/images lists them).
	CodeUnknownImage = "unknown_image"
	// CodeImageNotReady (503, with Retry-After): an acquire names an image that is being
	// pulled, whose pull failed, or that was removed; the detail says which.
	CodeImageNotReady = "image_not_ready"
	// CodeImageInUse (409): DELETE /v1/images/{name} while leases run on the image.
	CodeImageInUse = "image_in_use"
	// CodeSnapshotRefused (422): a snapshot of a lease that holds what an image layer
	// cannot (a file named .wh.*, an overlay redirect); the detail names it.
	CodeSnapshotRefused = "snapshot_refused"
)

// Problem is an RFC 9457 problem details body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
	// Script errors carry their position.
	Line   int `json:"line,omitempty"`
	Column int `json:"column,omitempty"`
	// Attach replies say how many requested bytes had left the buffer.
	BytesLost int64 `json:"bytes_lost,omitempty"`
}

// Capabilities is what this daemon can do, as reported by GET /v1/info.
type Capabilities struct {
	Exec             bool   `json:"exec"`
	PTY              bool   `json:"pty"`
	Files            bool   `json:"files"`
	Scripts          bool   `json:"scripts"`
	Cgroups          string `json:"cgroups"` // "v1", "v2" or "none"
	UIDIsolation     bool   `json:"uid_isolation"`
	NetworkIsolation bool   `json:"network_isolation"`
	Landlock         int    `json:"landlock_abi"` // 0: not available
	PrivateTmp       bool   `json:"private_tmp"`
	Isolation        string `json:"isolation"` // "strict" or "none"
	Seccomp          bool   `json:"seccomp"`   // lease processes run under the system-call filter
	// DiskQuota is what enforces limits.disk_bytes on lease processes: "loop" (a
	// filesystem of that size per lease) or "off" (API uploads are metered, nothing else).
	DiskQuota string `json:"disk_quota"`
	// Layers are the isolation layers in force, e.g. "cgroup-v2", "uid", "mount-ns",
	// "net-ns", "landlock-fs", "landlock-scope" (docs/api.md lists them all).
	Layers []string `json:"layers"`
}

// ServiceLimits are the daemon-wide limits a client should know about.
type ServiceLimits struct {
	MaxLeases        int    `json:"max_leases"`
	MaxTTLSeconds    int64  `json:"max_ttl_seconds"`
	MaxBodyBytes     int64  `json:"max_body_bytes"`
	MaxOutputBytes   int64  `json:"max_output_bytes"`
	OutputBufferSize int64  `json:"output_buffer_bytes"`
	MaxLimits        Limits `json:"max_limits"`
}

// Info is the body of GET /v1/info.
type Info struct {
	Version       string        `json:"version"`
	APIVersion    string        `json:"api_version"`
	Capabilities  Capabilities  `json:"capabilities"`
	Limits        ServiceLimits `json:"limits"`
	DefaultLimits Limits        `json:"default_limits"`
	DefaultTTL    int64         `json:"default_ttl_seconds"`
	// Draining: the daemon refuses new leases (POST /v1/drain, SIGUSR1, `sidecar drain`)
	// while its leases run to their end.
	Draining bool `json:"draining"`
	// Capacity is what is free now, for a client that places leases on several sidecars.
	Capacity Capacity    `json:"capacity"`
	Network  NetworkInfo `json:"network"`
	// CertNotAfter is when the daemon's TLS certificate expires (nil: not known).
	CertNotAfter *time.Time `json:"cert_not_after,omitempty"`
}

// Capacity is the free room of one daemon, as GET /v1/info reports it. Memory is
// counted by the leases' limits (what they may use), not by what they use now: a
// placement by committed memory does not overfill a host whose leases are idle.
type Capacity struct {
	ActiveLeases int `json:"active_leases"`
	FreeLeases   int `json:"free_leases"` // max_leases - active_leases, never below 0
	// MemoryBytes is what leases may commit in all: SIDECAR_CAPACITY_MEMORY_BYTES, else
	// the host's MemTotal.
	MemoryBytes          int64 `json:"memory_bytes"`
	MemoryCommittedBytes int64 `json:"memory_committed_bytes"` // sum of the active leases' memory limits
	MemoryHeadroomBytes  int64 `json:"memory_headroom_bytes"`  // memory_bytes - committed, never below 0
}

// DrainStatus is the reply of POST and DELETE /v1/drain.
type DrainStatus struct {
	Draining     bool `json:"draining"`
	ActiveLeases int  `json:"active_leases"` // leases still running; 0: the daemon can stop
}

// Limits bound one lease. Zero means "the daemon's default".
type Limits struct {
	MemoryBytes   int64 `json:"memory_bytes,omitempty"`
	CPUMillicores int64 `json:"cpu_millicores,omitempty"`
	Pids          int64 `json:"pids,omitempty"`
	DiskBytes     int64 `json:"disk_bytes,omitempty"`
}

// Egress modes of a lease's network policy.
const (
	EgressNone      = "none"      // nothing leaves the lease
	EgressAllowlist = "allowlist" // only what AllowOut names
	EgressInternet  = "internet"  // everything but DenyOut (the daemon's deny set always applies)
)

// NetworkPolicy is where a lease's connections may go: the acquire body's "network" and the
// body of PUT /v1/leases/{id}/network. AllowOut and DenyOut entries are IPv4/IPv6
// addresses or CIDRs ("203.0.113.0/24", "[2001:db8::/32]:443") or domain names
// ("pypi.org", "*.pythonhosted.org"), each with an optional ":port". AllowOut wins over
// DenyOut. Loopback, this host, other leases, private ranges, link-local (cloud metadata)
// and port 25 stay closed under every policy (docs/api.md, "Network").
type NetworkPolicy struct {
	Egress   string   `json:"egress"`
	AllowOut []string `json:"allow_out,omitempty"`
	DenyOut  []string `json:"deny_out,omitempty"`
}

// UnmarshalJSON also takes the string form of a mode ("none"), as older clients send it.
func (p *NetworkPolicy) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*p = NetworkPolicy{Egress: s}
		return nil
	}
	type plain NetworkPolicy
	return json.Unmarshal(b, (*plain)(p))
}

// NetworkStats is a lease's traffic through the daemon since the daemon attached it.
type NetworkStats struct {
	BytesSent          int64 `json:"bytes_sent"`
	BytesReceived      int64 `json:"bytes_received"`
	ConnectionsAllowed int64 `json:"connections_allowed"`
	ConnectionsDenied  int64 `json:"connections_denied"`
	ConnectionsOpen    int64 `json:"connections_open"`
}

// NetworkInfo is the daemon's network set-up, in GET /v1/info.
type NetworkInfo struct {
	// Isolation: "namespace" (each lease in a network namespace of its own, egress
	// through the daemon by policy) or "host" (leases share the host's network: no policy
	// is enforced; SIDECAR_NETWORK_ISOLATION=host or isolation "none").
	Isolation      string   `json:"isolation"`
	DefaultEgress  string   `json:"default_egress"`
	PrivateAllow   []string `json:"private_allow,omitempty"`
	MaxConnections int      `json:"max_connections"` // per lease
	// ProxyURL is what HTTP_PROXY and HTTPS_PROXY say inside a lease.
	ProxyURL string `json:"proxy_url,omitempty"`
}

// AcquireRequest is the body of POST /v1/leases.
type AcquireRequest struct {
	SessionID  string            `json:"session_id"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty"`
	Limits     Limits            `json:"limits,omitempty"`
	Network    *NetworkPolicy    `json:"network,omitempty"` // nil: the daemon's default (SIDECAR_NETWORK_DEFAULT)
	Labels     map[string]string `json:"labels,omitempty"`
	// Image is an image name of GET /v1/images; "": the daemon's default
	// (SIDECAR_DEFAULT_IMAGE); "host": the host's root filesystem.
	Image string `json:"image,omitempty"`
}

// Image states (ImageInfo.State).
const (
	ImageAbsent  = "absent"  // listed, not in the store: POST /v1/images/{name}/pull fetches it
	ImagePulling = "pulling" // being fetched and unpacked: Progress says how far
	ImageReady   = "ready"   // leases may run on it
	ImageFailed  = "failed"  // the last pull failed: Error says why; a pull retries
	ImageSaving  = "saving"  // a snapshot being written
)

// ImageInfo is one of the operator's images (GET /v1/images).
type ImageInfo struct {
	Name      string  `json:"name"`
	Ref       string  `json:"ref"`              // as SIDECAR_IMAGES gives it
	Digest    string  `json:"digest,omitempty"` // the manifest's, once pulled
	SizeBytes int64   `json:"size_bytes"`       // its unpacked layers on disk (shared layers count in each image)
	State     string  `json:"state"`
	Progress  float64 `json:"progress"` // of a pull, 0 to 1 (by the layers' compressed bytes)
	InUse     int     `json:"in_use"`   // leases running on it
	Error     string  `json:"error,omitempty"`
	// Root: its leases run as root in a user namespace of their own (SIDECAR_ROOT_IMAGES),
	// and may install packages into it.
	Root bool `json:"root"`
	// Owned: its leases own what root owns in the image (its layers id-mapped onto the
	// lease's uid), so they change it in their writable layer as root in a container
	// would: pip install into the image's Python, npm install -g. False where the host
	// cannot id-map the image store (operations §17): they read those files as root's.
	Owned bool `json:"owned"`
	// Snapshot is set on an image made from a lease (POST /v1/leases/{id}/snapshot).
	Snapshot *SnapshotInfo `json:"snapshot,omitempty"`
}

// SnapshotInfo is what ImageInfo says of a snapshot.
type SnapshotInfo struct {
	Base      string    `json:"base"`  // the listed image it descends from
	Lease     string    `json:"lease"` // the lease it was taken of
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is when it is removed (SIDECAR_SNAPSHOT_MAX_AGE), once no lease runs on
	// it; absent: kept until removed.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// SnapshotRequest is the body of POST /v1/leases/{id}/snapshot.
type SnapshotRequest struct {
	// Name is the new image's: 1 to 63 of a-z 0-9 . _ -, not an image's already.
	Name string `json:"name"`
}

// ImageList is the body of GET /v1/images.
type ImageList struct {
	Images []ImageInfo `json:"images"`
	// DefaultImage is what an acquire without image runs on: an image name, or "host".
	DefaultImage string `json:"default_image"`
	// UsedBytes is what the store's unpacked layers take (each layer once), of
	// LimitBytes (SIDECAR_IMAGE_STORE_BYTES).
	UsedBytes  int64 `json:"used_bytes"`
	LimitBytes int64 `json:"limit_bytes"`
}

// RenewRequest is the body of POST /v1/leases/{id}/renew.
type RenewRequest struct {
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
}

// Lease states.
const (
	LeaseActive   = "active"
	LeaseExpired  = "expired"
	LeaseReleased = "released"
)

// Usage is what a lease consumes now.
type Usage struct {
	MemoryBytes int64   `json:"memory_bytes"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	Pids        int64   `json:"pids"`
	DiskBytes   int64   `json:"disk_bytes"`
	OOMKills    int64   `json:"oom_kills"`
}

// The usage history the daemon keeps of each lease: a sample every
// UsageSampleInterval, the last UsageHistorySamples of them (one hour).
const (
	UsageSampleInterval = 10 * time.Second
	UsageHistorySamples = 360
)

// UsageSample is a lease's usage at one moment.
type UsageSample struct {
	At time.Time `json:"at"`
	Usage
}

// UsageHistory is the reply of GET /v1/leases/{id}/usage: the lease's samples, oldest
// first, at most UsageHistorySamples of them taken every IntervalSeconds.
type UsageHistory struct {
	IntervalSeconds int64         `json:"interval_seconds"`
	Samples         []UsageSample `json:"samples"`
}

// Lease is one session's sandbox as the inspection endpoint shows it.
type Lease struct {
	ID             string            `json:"id"`
	SessionID      string            `json:"session_id"`
	Labels         map[string]string `json:"labels,omitempty"`
	State          string            `json:"state"`
	Network        NetworkPolicy     `json:"network"`
	Image          string            `json:"image"`                   // the image it runs on; "host": the host's root filesystem
	NetworkStats   *NetworkStats     `json:"network_stats,omitempty"` // nil: the lease shares the host's network
	CreatedAt      time.Time         `json:"created_at"`
	ExpiresAt      time.Time         `json:"expires_at"`
	LastActivityAt time.Time         `json:"last_activity_at"`
	Limits         Limits            `json:"limits"`
	Usage          *Usage            `json:"usage,omitempty"`
	Processes      int               `json:"process_count"`
	UID            int               `json:"uid,omitempty"`
	Workdir        string            `json:"workdir,omitempty"`
	// Token is set only in acquire and renew responses.
	Token string `json:"token,omitempty"`

	// LeftoverCount counts the processes finished commands left running in the lease
	// (`server &`); Leftovers describes the first MaxLeftoversListed of them.
	LeftoverCount int        `json:"leftover_count"`
	Leftovers     []Leftover `json:"leftovers,omitempty"`
}

// MaxLeftoversListed bounds Lease.Leftovers; LeftoverCount is exact.
const MaxLeftoversListed = 256

// Leftover is a process a finished command left running in its lease. PID is the
// process id inside the lease (the same as on the host); signal it alone with POST
// …/leftovers/{pid}/signal.
type Leftover struct {
	PID       int       `json:"pid"`
	Argv      []string  `json:"argv"`
	StartedAt time.Time `json:"started_at"`
	RSSBytes  int64     `json:"rss_bytes"`
}

// LeaseList is the body of GET /v1/leases.
type LeaseList struct {
	Leases []Lease `json:"leases"`
}

// CleanupResult is the body of POST /v1/cleanup.
type CleanupResult struct {
	Leases    []string `json:"leases"`
	Cgroups   []string `json:"cgroups"`
	Workdirs  []string `json:"workdirs"`
	Processes []int    `json:"processes"`
}

// ExecRequest is the body of POST /v1/leases/{id}/exec.
type ExecRequest struct {
	Argv               []string          `json:"argv"`
	Env                map[string]string `json:"env,omitempty"`
	Cwd                string            `json:"cwd,omitempty"` // workdir-relative or absolute under Workspace; "": Workspace
	Stdin              *string           `json:"stdin,omitempty"`
	TimeoutSeconds     float64           `json:"timeout_seconds,omitempty"`
	IdleTimeoutSeconds float64           `json:"idle_timeout_seconds,omitempty"`
	// KillLeftovers kills what the command leaves behind once it exits; without it
	// that stays in the lease (listed as its leftovers) until the lease ends.
	KillLeftovers bool `json:"kill_leftovers,omitempty"`
	// OutputHeadBytes: of the max_output_bytes kept of a stream that outgrows them (GET
	// /v1/info), how many come from its start; the rest come from its end. nil: half.
	// Outside 0..max_output_bytes: 400 invalid_request.
	OutputHeadBytes *int64 `json:"output_head_bytes,omitempty"`
}

// ExecResult is the body of a finished exec.
//
// A stream longer than the daemon's max_output_bytes (or than the output budget lets it
// hold) comes back as its head and its end: Stdout is the first StdoutDroppedAt
// characters (Unicode code points, as a JSON parser decodes them) of the output, then its
// last bytes; the StdoutDropped bytes in between are gone, and StdoutTruncated is set.
// OutputParts splits them.
type ExecResult struct {
	ExitCode        int    `json:"exit_code"`
	Signal          string `json:"signal,omitempty"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutDropped   int64  `json:"stdout_dropped"`
	StderrDropped   int64  `json:"stderr_dropped"`
	StdoutDroppedAt int64  `json:"stdout_dropped_at"`
	StderrDroppedAt int64  `json:"stderr_dropped_at"`
	TimedOut        bool   `json:"timed_out"`
	OOMKilled       bool   `json:"oom_killed"`
	DurationMS      int64  `json:"duration_ms"`
}

// StartRequest is the body of POST /v1/leases/{id}/processes.
type StartRequest struct {
	ID   string            `json:"id,omitempty"`
	Argv []string          `json:"argv"`
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"` // as ExecRequest.Cwd
	TTY  bool              `json:"tty,omitempty"`
	// Stdin keeps the process's stdin open for attachments to write to; without it (and
	// without TTY) stdin is empty.
	Stdin              bool    `json:"stdin,omitempty"`
	Rows               uint16  `json:"rows,omitempty"`
	Cols               uint16  `json:"cols,omitempty"`
	TimeoutSeconds     float64 `json:"timeout_seconds,omitempty"`
	IdleTimeoutSeconds float64 `json:"idle_timeout_seconds,omitempty"`
	// KillLeftovers: as ExecRequest's, once the process exits.
	KillLeftovers bool `json:"kill_leftovers,omitempty"`
	// Lossless keeps the output from its first byte for the first lossless attach
	// (?lossless=1), for at most LosslessAttachWaitSeconds: the process blocks once the
	// replay buffer is full rather than lose bytes that viewer has not seen.
	Lossless bool `json:"lossless,omitempty"`
}

// LosslessAttachWaitSeconds bounds how long a process started with Lossless waits for
// its first lossless viewer before its output goes back to the lossy ring.
const LosslessAttachWaitSeconds = 10

// Output modes of an attach (HeaderOutputMode).
const (
	OutputModeLossy    = "lossy"
	OutputModeLossless = "lossless"
)

// Process states.
const (
	ProcessRunning = "running"
	ProcessExited  = "exited"
	// ProcessLost: the daemon died while the process ran; its exit status is unknown.
	ProcessLost = "lost"
)

// Process is the status of a background process.
type Process struct {
	PID       string     `json:"pid"`
	Argv      []string   `json:"argv"`
	TTY       bool       `json:"tty"`
	State     string     `json:"state"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	Signal    string     `json:"signal,omitempty"`
	TimedOut  bool       `json:"timed_out,omitempty"`
	OOMKilled bool       `json:"oom_killed,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// OutputOffset is the number of output bytes produced so far; OutputStart the
	// oldest offset still in the replay buffer.
	OutputOffset int64 `json:"output_offset"`
	OutputStart  int64 `json:"output_start"`
}

// ProcessList is the body of GET /v1/leases/{id}/processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// ShellCreateRequest is the body of POST /v1/leases/{id}/shells.
type ShellCreateRequest struct {
	// Shell is an absolute path to a POSIX shell inside the lease; empty: bash when the
	// lease has it, else /bin/sh.
	Shell string            `json:"shell,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
}

// Shell is the status of a shell session.
type Shell struct {
	// ID is the session's id, also its shell's process id (listed with the processes).
	ID string `json:"id"`
	// Shell is "bash" or "sh".
	Shell string `json:"shell"`
	// Cwd is the shell's working directory after its last command ("" before the first).
	Cwd          string    `json:"cwd"`
	Busy         bool      `json:"busy"`
	StartedAt    time.Time `json:"started_at"`
	Commands     int       `json:"commands"`
	LastExitCode *int      `json:"last_exit_code,omitempty"`
}

// ShellList is the body of GET /v1/leases/{id}/shells.
type ShellList struct {
	Shells []Shell `json:"shells"`
}

// ShellRunRequest is the body of POST /v1/leases/{id}/shells/{sid}/run.
type ShellRunRequest struct {
	Command        string  `json:"command"`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
	// OutputHeadBytes: as ExecRequest's.
	OutputHeadBytes *int64 `json:"output_head_bytes,omitempty"`
}

// ShellResult is the body of a finished shell command; its output fields are
// ExecResult's.
type ShellResult struct {
	ExitCode        int    `json:"exit_code"`
	Signal          string `json:"signal,omitempty"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutDropped   int64  `json:"stdout_dropped"`
	StderrDropped   int64  `json:"stderr_dropped"`
	StdoutDroppedAt int64  `json:"stdout_dropped_at"`
	StderrDroppedAt int64  `json:"stderr_dropped_at"`
	TimedOut        bool   `json:"timed_out"`
	// Ended: the shell itself exited (or was killed) during the command; ExitCode is the
	// shell's, and the session is gone.
	Ended bool `json:"ended"`
	// Cwd is the shell's working directory after the command ("" once Ended).
	Cwd        string `json:"cwd"`
	DurationMS int64  `json:"duration_ms"`
}

// SignalRequest is the body of POST …/processes/{pid}/signal.
// SignalRequest is the body of POST …/processes/{pid}/signal and …/leftovers/{pid}/signal.
type SignalRequest struct {
	Signal string `json:"signal"`
}

// FileEntry is one row of a directory listing.
type FileEntry struct {
	Name    string    `json:"name"`
	Type    string    `json:"type"` // "file", "dir", "symlink", "other"
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // octal permission bits, e.g. "0644"
	ModTime time.Time `json:"mtime"`
	Target  string    `json:"target,omitempty"`
}

// DirListing is the JSON body of GET on a directory.
type DirListing struct {
	Path    string      `json:"path"`
	Entries []FileEntry `json:"entries"`
}

// ScriptRequest is the body of POST /v1/scripts/run.
type ScriptRequest struct {
	Source      string `json:"source"`
	Input       any    `json:"input"`
	TimeoutMS   int64  `json:"timeout_ms,omitempty"`
	MemoryBytes int64  `json:"memory_bytes,omitempty"`
}

// ScriptResult is the body of a successful script run.
type ScriptResult struct {
	Result     any      `json:"result"`
	Logs       []string `json:"logs"`
	DurationMS int64    `json:"duration_ms"`
}
