package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/confine"
	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
	"github.com/sidecar-sandbox/sidecar/internal/kernel/landlock"
	"github.com/sidecar-sandbox/sidecar/internal/kernel/seccomp"
)

// Isolation modes.
const (
	IsolationStrict = "strict"
	IsolationNone   = "none"
	SeccompStrict   = "strict"
	SeccompOff      = "off"
)

// LeaseRlimits are the resource limits of every lease process in strict isolation (soft =
// hard), set by the helper before it drops privileges. The inherited ones are the daemon's (20,000 open files
// in its unit), sized for a daemon, not for one of many tenants:
//   - nofile 4096: also bounds what a lease holds of kernel objects per process (PTYs,
//     sockets, inotify watches, epoll instances…);
//   - core 0: a crashing lease program writes no core file (its size is the process's,
//     written to the lease's disk or handed to the host's core_pattern handler);
//   - memlock 64 KiB: locked memory cannot be reclaimed under host pressure;
//   - msgqueue 800 KiB (Linux's default), sigpending 4096: kernel memory a uid may queue.
//
// RLIMIT_FSIZE is left alone: the disk quota bounds what a lease writes, and a size limit
// would kill legitimate large files with SIGXFSZ.
var LeaseRlimits = []initproc.Rlimit{
	{Name: "nofile", Value: 4096},
	{Name: "core", Value: 0},
	{Name: "memlock", Value: 64 << 10},
	{Name: "msgqueue", Value: 819200},
	{Name: "sigpending", Value: 4096},
}

// Config configures a Sandbox; zero values take the documented defaults. New trusts the
// values it is given: the daemon's Config.Check owns the rules, naming the variables.
type Config struct {
	CgroupParent string // default "sidecar": v1 → <hierarchy>/sidecar/<lease>; v2 → <daemon's own delegated cgroup>/sidecar/<lease>, or /sys/fs/cgroup/sidecar/<lease> when started by hand (package confine)
	Isolation    string // "strict" (default): New fails listing every missing base layer (root, cgroups, namespaces); "none": run without, loudly
	HelperPath   string // the binary that runs the init helper; default: sidecar-init next to os.Executable() if present, else os.Executable()
	Seccomp      string // "strict" (default): every lease process runs under package seccomp's filter; "off": none, loudly
	PTYRoot      string // strict isolation: each lease's devpts instance is mounted at <PTYRoot>/<lease> (a root-only directory, made if missing; instances left there by an earlier run are removed); "": leases use the host's PTYs
	MaxPTYs      int    // PTYs per lease (its instance's max); default DefaultMaxPTYs
	UserRoot     string // strict isolation: each lease's /etc/passwd and /etc/group (its uid named LeaseUser) are written under <UserRoot>/<lease> (a root-only directory, made if missing; what an earlier run left there is removed); "": leases see the host's, where their uid has no name
	// DetachRoots (BindMountRoots' Dirs) are mount points holding every lease's mounts:
	// strict isolation detaches them from each lease helper's mount namespace, which then
	// holds no other lease's mounts.
	DetachRoots []string
	// HelperMountNS (MountRoots.HelperMountNS) is what the C helper copies for a lease's
	// mount namespace instead of the daemon's, with the lease's bind sources put back;
	// nil: the daemon's. The caller closes it after Close.
	HelperMountNS *os.File
	Logger        *slog.Logger

	// Operator floors: New fails below them, naming what the host needs. 0 / "": none.
	MinLandlockABI int    // the lowest Landlock ABI lease processes may get (1..MaxKnownLandlockABI)
	RequireCgroup  string // "v1" or "v2"
	// LandlockMaxABI caps the Landlock ABI lease processes get, so that tests run the
	// isolation checks at every ABI on one kernel: 0 is the kernel's best, NoLandlock none.
	LandlockMaxABI int
	// Owner is the daemon's state dir: with it, New claims CgroupParent for this process
	// (owner.go) and fails with ErrParentOwned while another running daemon holds it.
	// "" claims nothing (tests that run many sandboxes on one parent).
	Owner string
	// ColdStart makes every command start the plain way, without launchers (package confine):
	// for benchmarks that compare the two.
	ColdStart bool
	// LeasePath are directories appended to DefaultPath in lease processes' PATH
	// (SIDECAR_LEASE_PATH, see LeasePathDirs): tools the host has outside the default,
	// such as /usr/local/go/bin. Each must be an existing directory.
	LeasePath []string
}

// Caps says which isolation is in force (shown in /v1/info).
type Caps struct {
	Cgroups          string // v1 | v2 | none
	UIDIsolation     bool
	PrivateTmp       bool
	NetworkIsolation bool
	LandlockABI      int // the ABI lease processes get, 0: no Landlock
	Isolation        string
	Seccomp          bool     // the system-call filter is on every lease process
	Layers           []string // the layers in force, Layer* names
	// RootLeases: a lease on an image may run as root in a user namespace of its own, or
	// own its image's files (LeaseRoot.AsRoot, Owned; userns.go): strict isolation with
	// the C helper.
	RootLeases bool
}

// LeaseSpec is what Provision needs of a lease.
type LeaseSpec struct {
	ID       string
	UID, GID int    // 0: none (isolation none or non-root)
	Workdir  string // absolute; exists (mode 0700, root-owned) when Provision is called
	TmpDir   string // absolute; exists likewise; bind-mounted on /tmp for the lease's processes
	// Limits; 0 means no limit at the lease level.
	MemoryBytes, CPUMillicores, Pids int64
	// Network puts the lease in a network namespace of its own (loopback only); nil
	// leaves it on the host's network.
	Network *LeaseNetwork
	// Root runs the lease in an image (rootfs.go), its overlay in the directory that
	// holds Workdir and TmpDir; nil: the host's root, read-only.
	Root *LeaseRoot
	// HomeDir is the lease's home tree (absolute; exists, beside Workdir on the lease's
	// disk): with a mount namespace per process it is bound on /home and the lease's HOME
	// is /home/<LeaseUser> in it, so tool caches and dotfiles stay out of the workdir.
	// "" (or a host without /home, for the host's root): HOME is the workdir.
	HomeDir string
}

// LeaseNetwork is what a lease with a network namespace of its own is given to reach out:
// the daemon serves its egress inside the namespace (lease/network), and lease processes
// find it through Env and ResolvConf.
type LeaseNetwork struct {
	Env        []string // added to every lease process's environment (the proxy variables)
	ResolvConf string   // the lease's /etc/resolv.conf; "": the host's
}

// Usage is a lease's resource use so far.
type Usage = confine.Usage

const (
	DefaultCgroupParent = confine.DefaultParent
	HelperArg           = "__sandbox-init"
	helperBinaryName    = "sidecar-init"
)

var leaseIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`)

// Sandbox is the isolation layer; it is safe for concurrent use.
type Sandbox struct {
	caps     Caps
	log      *slog.Logger
	cg       confine.Cgroups   // nil without cgroups
	eng      *confine.Engine   // starts every lease process; a lease is a cell there
	helper   string            // the helper binary
	userns   *usernsFactory    // makes the user namespaces of leases whose layers are id-mapped
	hostMNS  string            // the daemon's mount namespace, which the helper must not mount in
	filter   []unix.SockFilter // the system-call filter every lease process loads; nil: none
	ptyRoot  string            // where leases' devpts instances are mounted; "" for the host's PTYs
	detach   []string          // Config.DetachRoots
	helperNS *os.File          // Config.HelperMountNS, with the C helper only
	maxPTYs  int
	// userRoot holds each lease's passwd and group ("": none); users is what they say.
	userRoot string
	users    userDB
	shell    string // $SHELL of lease processes
	hostHome bool   // the host's root has /home to bind a lease's home tree on
	// noOpenat2 says why openat2(2) fails here, if it does: leases in images resolve
	// their paths with it (RESOLVE_IN_ROOT here, RESOLVE_BENEATH in the helper).
	noOpenat2 error
	// rootSources names this sandbox's lease overlays in mountinfo (rootSources).
	rootSources string
	path        string // $PATH of lease processes: DefaultPath and Config.LeasePath
	// landlockMax is Config.LandlockMaxABI: the cap the helper is told to apply.
	landlockMax int
	owner       *ownerLock // the lock on the cgroup parent (owner.go), nil without Config.Owner
	hostFiles   *hostFiles // heals leases' views when the host replaces a user file; nil: not watched

	mu     sync.Mutex
	leases map[string]*lease
}

// lease is what the daemon holds for a provisioned lease in this run.
type lease struct {
	spec   LeaseSpec
	netns  *os.File // the lease's network namespace; nil on the host's network
	resolv string   // the lease's resolv.conf; "" for the host's
	pts    string   // the lease's devpts instance (mounted); "" for the host's PTYs
	passwd string   // the lease's /etc/passwd and /etc/group; "" for the host's
	group  string
	root   string   // the merged directory of the lease's root overlay; "" for the host's root
	rootRW []string // what Landlock lets the lease write in its root (rootWritable)
	userns *os.File // the lease's user namespace when its layers are id-mapped (userns.go); nil otherwise
	killed bool     // Teardown has run: nothing starts in it any more; Retire removes it
}

// liveLease is lease id unless unknown or torn down (nil). Call with mu held.
func (s *Sandbox) liveLease(id string) *lease {
	if le := s.leases[id]; le != nil && !le.killed {
		return le
	}
	return nil
}

// New probes the host and returns a Sandbox. In strict mode it fails naming every missing
// piece; in "none" mode it logs loudly and runs without cgroups, uid switching or private
// namespaces, with best-effort Landlock.
func New(cfg Config) (*Sandbox, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if cfg.Isolation == "" {
		cfg.Isolation = IsolationStrict
	}
	if cfg.Seccomp == "" {
		cfg.Seccomp = SeccompStrict
	}
	helper, err := helperPath(cfg.HelperPath)
	if err != nil {
		return nil, err
	}
	path, err := leasePath(cfg.LeasePath)
	if err != nil {
		return nil, err
	}
	s := &Sandbox{log: cfg.Logger, helper: helper, leases: map[string]*lease{}, landlockMax: cfg.LandlockMaxABI, shell: loginShell(), path: path, rootSources: rootSources(cfg.CgroupParent)}
	s.userns = &usernsFactory{helper: helper}
	s.caps.Isolation = cfg.Isolation
	s.caps.Seccomp = cfg.Seccomp == SeccompStrict && seccomp.Available()
	if s.caps.Seccomp {
		if s.filter, err = seccomp.Program(); err != nil {
			return nil, err
		}
	}
	if cfg.Seccomp == SeccompOff {
		cfg.Logger.Warn("seccomp is OFF: lease processes and script workers may create user namespaces, open raw sockets and reach the rest of the kernel surface the filter denies",
			"seccomp", SeccompOff)
	}
	kernelABI := landlock.ABI()
	s.caps.LandlockABI = appliedLandlockABI(kernelABI, cfg.LandlockMaxABI)

	var missing []string
	if abi := s.caps.LandlockABI; abi < cfg.MinLandlockABI {
		have := fmt.Sprintf("this kernel has ABI %d", kernelABI)
		if abi != kernelABI {
			have = fmt.Sprintf("capped at %d", abi)
		}
		missing = append(missing, fmt.Sprintf("Landlock ABI >= %d as required (Linux %s or later with landlock in lsm=; %s)",
			cfg.MinLandlockABI, LandlockLinux(cfg.MinLandlockABI), have))
	}
	if cfg.Isolation == IsolationNone {
		if len(missing) > 0 {
			return nil, fmt.Errorf("sandbox: %s", strings.Join(missing, "; "))
		}
		cfg.Logger.Warn("sandbox isolation is OFF: lease processes run as the daemon's user with no cgroup, no private /tmp and best-effort Landlock",
			"isolation", IsolationNone, "landlock_abi", s.caps.LandlockABI)
		s.caps.Layers = s.caps.layers()
		s.eng = confine.NewEngine(confine.EngineConfig{Helper: helper, HelperArg: HelperArg, Logger: cfg.Logger})
		return s, nil
	}

	if os.Geteuid() != 0 {
		// Cgroups and namespaces are set up by root: without it they are not even tried.
		missing = append(missing, "root (uid switching, cgroups and namespaces need it; not probed without it)")
	} else {
		cg, err := confine.OpenCgroups(cfg.CgroupParent, cfg.Logger)
		switch {
		case err != nil:
			missing = append(missing, "cgroups with memory, pids and cpu: "+err.Error())
		case cfg.RequireCgroup != "" && cg.Version() != cfg.RequireCgroup:
			missing = append(missing, fmt.Sprintf("cgroup %s as required (this host's controllers are on cgroup %s)", cfg.RequireCgroup, cg.Version()))
		}
		s.cg = cg
		missing = append(missing, probeNamespaces(helper)...)
	}
	if cfg.Seccomp == SeccompStrict && !s.caps.Seccomp {
		missing = append(missing, "seccomp filters (CONFIG_SECCOMP_FILTER on amd64 or arm64; or SIDECAR_SECCOMP=off)")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("sandbox: isolation %q unavailable, missing: %s (set SIDECAR_ISOLATION=none to run without)",
			IsolationStrict, strings.Join(missing, "; "))
	}
	if s.hostMNS, err = os.Readlink("/proc/self/ns/mnt"); err != nil {
		return nil, fmt.Errorf("sandbox: mount namespace: %w", err)
	}
	if st, err := os.Stat(HomeMount); err == nil && st.IsDir() {
		s.hostHome = true
	}
	// A filter may refuse openat2, as systemd's does under RestrictSUIDSGID=yes: leases in
	// images are then refused by name, not failed command by command.
	if s.noOpenat2 = probeOpenat2(); s.noOpenat2 != nil {
		cfg.Logger.Warn("openat2 is refused (a seccomp filter, such as systemd's for RestrictSUIDSGID=yes): leases in images are refused", "err", s.noOpenat2)
	}
	if err := ensureWorkspace(); err != nil {
		return nil, err
	}
	if cfg.Owner != "" {
		if s.owner, err = claimParent(ownerDir, s.cg.Key(), cfg.Owner, cfg.Logger); err != nil {
			return nil, err
		}
	}
	if cfg.MaxPTYs <= 0 {
		cfg.MaxPTYs = DefaultMaxPTYs
	}
	if cfg.PTYRoot != "" {
		if !filepath.IsAbs(cfg.PTYRoot) {
			return nil, fmt.Errorf("%w: PTY root %q is not absolute", ErrInvalid, cfg.PTYRoot)
		}
		if err := os.MkdirAll(cfg.PTYRoot, 0o700); err != nil {
			return nil, fmt.Errorf("sandbox: PTY root: %w", err)
		}
		if err := sweepPTS(cfg.PTYRoot); err != nil {
			return nil, fmt.Errorf("sandbox: PTY instances of an earlier run: %w", err)
		}
		s.ptyRoot, s.maxPTYs = cfg.PTYRoot, cfg.MaxPTYs
	}
	s.detach = slices.Clone(cfg.DetachRoots)
	if cfg.UserRoot != "" {
		if !filepath.IsAbs(cfg.UserRoot) {
			return nil, fmt.Errorf("%w: user root %q is not absolute", ErrInvalid, cfg.UserRoot)
		}
		if err := os.MkdirAll(cfg.UserRoot, 0o700); err != nil {
			return nil, fmt.Errorf("sandbox: user root: %w", err)
		}
		if err := sweepUserFiles(cfg.UserRoot); err != nil {
			return nil, fmt.Errorf("sandbox: user files of an earlier run: %w", err)
		}
		var ok bool
		if s.users, ok = loadUserDB(); ok {
			s.userRoot = cfg.UserRoot
		} else {
			cfg.Logger.Warn("this host has no /etc/passwd or /etc/group file to bind over: lease uids have no name inside leases")
		}
	}
	s.eng = confine.NewEngine(confine.EngineConfig{Cgroups: s.cg, Helper: helper, HelperArg: HelperArg, ColdStart: cfg.ColdStart, Forks: cHelper(helper), Logger: cfg.Logger})
	if cHelper(helper) { // only the C helper can enter it
		s.helperNS = cfg.HelperMountNS
	}
	if cHelper(helper) { // only zygotes, the C helper's, keep binds to heal
		if s.hostFiles, err = watchHostFiles(s.eng.Heal, cfg.Logger); err != nil {
			cfg.Logger.Warn("cannot watch the host's passwd, group and resolv.conf: after the host replaces one, a lease on the host's root sees its own again only at its next command", "err", err)
		}
	}
	s.caps.Cgroups = s.cg.Version()
	s.caps.UIDIsolation = true
	s.caps.PrivateTmp = true
	s.caps.NetworkIsolation = true
	s.caps.RootLeases = cHelper(helper)
	s.caps.Layers = s.caps.layers()
	return s, nil
}

// Caps reports the isolation in force.
func (s *Sandbox) Caps() Caps {
	c := s.caps
	c.Layers = slices.Clone(c.Layers)
	if c.Cgroups == "" {
		c.Cgroups = "none"
	}
	return c
}

func (s *Sandbox) strict() bool { return s.caps.Isolation == IsolationStrict }

// helperPath picks the helper binary: an explicit path, else a tiny sidecar-init next to
// the daemon (cheaper to start), else the daemon itself.
func helperPath(p string) (string, error) {
	if p != "" {
		if !filepath.IsAbs(p) {
			return "", fmt.Errorf("%w: helper path %q is not absolute", ErrInvalid, p)
		}
		return p, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("sandbox: find own binary: %w", err)
	}
	return HelperBeside(self), nil
}

// HelperBeside is the helper for the daemon binary daemon: the tiny sidecar-init beside
// it when there is one (it starts several times faster than the daemon's own binary run
// as `sidecar __sandbox-init`), else the daemon binary.
func HelperBeside(daemon string) string {
	tiny := filepath.Join(filepath.Dir(daemon), helperBinaryName)
	if st, err := os.Stat(tiny); err == nil && st.Mode().IsRegular() {
		return tiny
	}
	return daemon
}

func validateSpec(l LeaseSpec) error {
	if !leaseIDPattern.MatchString(l.ID) {
		return fmt.Errorf("%w: lease id %q", ErrInvalid, l.ID)
	}
	for _, d := range []string{l.Workdir, l.TmpDir} {
		if !filepath.IsAbs(d) || filepath.Clean(d) != d || d == "/" {
			return fmt.Errorf("%w: lease directory %q must be absolute and clean", ErrInvalid, d)
		}
	}
	if l.Workdir == l.TmpDir {
		return fmt.Errorf("%w: workdir and tmp dir must differ", ErrInvalid)
	}
	if h := l.HomeDir; h != "" && (!filepath.IsAbs(h) || filepath.Clean(h) != h || h == "/" || h == l.Workdir || h == l.TmpDir) {
		return fmt.Errorf("%w: home dir %q must be absolute, clean and apart from the workdir and tmp dir", ErrInvalid, h)
	}
	// The limits were checked against what the kernel enforces by package lease, before
	// any directory or disk was made for the lease.
	if l.UID < 0 || l.GID < 0 {
		return fmt.Errorf("%w: negative uid/gid", ErrInvalid)
	}
	return validateRoot(l)
}

// Provision prepares a lease: its cgroup with limits (created or adopted), Workdir and
// TmpDir owned by UID:GID with mode 0700, and a network namespace when Network is set. It
// is idempotent, so the lease package calls it again after a daemon restart.
func (s *Sandbox) Provision(ctx context.Context, l LeaseSpec) error {
	if err := validateSpec(l); err != nil {
		return err
	}
	if s.strict() && (l.UID == 0 || l.GID == 0) {
		return fmt.Errorf("%w: strict isolation needs a non-root uid and gid for lease %s", ErrInvalid, l.ID)
	}
	if !s.strict() && (l.UID != 0 || l.GID != 0) {
		return fmt.Errorf("%w: uid switching needs strict isolation", ErrUnsupported)
	}
	if l.Network != nil && !s.caps.NetworkIsolation {
		return fmt.Errorf("%w: network isolation", ErrUnsupported)
	}
	if l.Root != nil && !s.caps.PrivateTmp {
		return fmt.Errorf("%w: an image root needs strict isolation (a mount namespace per process)", ErrUnsupported)
	}
	if l.Root != nil && s.noOpenat2 != nil {
		return fmt.Errorf("%w: a lease in an image needs openat2(2), refused here (%v): a systemd unit must leave RestrictSUIDSGID= off, as the shipped one does", ErrUnsupported, s.noOpenat2)
	}
	if l.Root.idMapped() && !s.caps.RootLeases {
		return errRootLeases
	}
	if _, under := under(l.Workdir, "/tmp"); under && s.caps.PrivateTmp {
		return fmt.Errorf("%w: workdir %s is under /tmp, which the lease's private /tmp hides", ErrInvalid, l.Workdir)
	}
	for _, d := range []string{l.Workdir, l.TmpDir} {
		if _, under := under(d, Workspace); under && s.caps.PrivateTmp {
			return fmt.Errorf("%w: lease directory %s is under %s, where leases see their workdir", ErrInvalid, d, Workspace)
		}
	}
	for _, d := range []string{l.Workdir, l.TmpDir} {
		if err := ownDir(d, l.UID, l.GID); err != nil {
			return err
		}
	}
	if err := s.provisionHome(l); err != nil {
		return err
	}
	if s.cg != nil {
		if err := s.eng.Open(l.ID, confine.Limits{MemoryBytes: l.MemoryBytes, CPUMillicores: l.CPUMillicores, Pids: l.Pids}); err != nil {
			return fmt.Errorf("sandbox: lease %s cgroup: %w", l.ID, err)
		}
	}
	pts, err := s.mountPTS(l.ID)
	if err != nil {
		return err
	}
	var passwd, group, resolv string
	if s.userRoot != "" {
		if passwd, group, resolv, err = s.writeUserFiles(l); err != nil {
			return err
		}
	}

	userns, made, err := s.leaseUserNS(l)
	if err != nil {
		return err
	}
	root, rootRW, err := s.provisionRoot(l, userns)
	if err == nil && l.Root != nil && len(l.Root.Stacks) > 0 {
		err = s.provisionHome(l) // a stacked home shows its lower's tree, which may lack the user's
	}
	if err != nil {
		if made {
			userns.Close()
		}
		return err
	}
	le, err := s.register(l, pts, passwd, group, resolv, root, rootRW, userns)
	if err != nil {
		return err
	}
	s.log.DebugContext(ctx, "lease provisioned", "lease", l.ID, "uid", l.UID, "netns", l.Network != nil)
	s.eng.SetTemplate(l.ID, func() confine.Start { return s.start(le) }) // what its launchers are made with
	return nil
}

// register records a provisioned lease, making its network namespace if it needs one.
func (s *Sandbox) register(l LeaseSpec, pts, passwd, group, resolv, root string, rootRW []string, userns *os.File) (*lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	le := s.leases[l.ID]
	if le == nil {
		le = &lease{}
		s.leases[l.ID] = le
	}
	le.spec, le.pts, le.passwd, le.group, le.resolv = l, pts, passwd, group, resolv
	le.root, le.rootRW, le.userns = root, rootRW, userns
	if l.Network != nil && le.netns == nil {
		ns, err := newNetNS()
		if err != nil {
			return nil, fmt.Errorf("sandbox: lease %s network namespace: %w", l.ID, err)
		}
		le.netns = ns
	}
	return le, nil
}

// leaseUserNS is the user namespace of lease l if its layers are id-mapped: the one it has
// from an earlier Provision in this run, else a new one (made). nil for any other lease.
func (s *Sandbox) leaseUserNS(l LeaseSpec) (ns *os.File, made bool, err error) {
	if !l.Root.idMapped() {
		return nil, false, nil
	}
	if l.UID == 0 || l.GID == 0 {
		return nil, false, fmt.Errorf("%w: lease %s owns its image's files through a user namespace and needs a uid and gid to map root onto", ErrInvalid, l.ID)
	}
	s.mu.Lock()
	le := s.leases[l.ID]
	s.mu.Unlock()
	if le != nil && le.userns != nil {
		return le.userns, false, nil
	}
	ns, err = s.userns.make(l.UID, l.GID)
	return ns, err == nil, err
}

// NetNS is the lease's network namespace, for the daemon to serve and reach the lease in
// it; nil for a lease on the host's network. The descriptor stays the sandbox's.
func (s *Sandbox) NetNS(leaseID string) (*os.File, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	le := s.leases[leaseID]
	if le == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownLease, leaseID)
	}
	return le.netns, nil
}

// ownDir hands a lease directory to its uid. It must be a real directory, not a symlink.
func ownDir(dir string, uid, gid int) error {
	st, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", ErrInvalid, dir)
	}
	if uid != 0 || gid != 0 {
		if err := os.Lchown(dir, uid, gid); err != nil {
			return fmt.Errorf("sandbox: chown %s: %w", dir, err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox: chmod %s: %w", dir, err)
	}
	return nil
}

// Teardown kills every process of the lease (confine.Engine.Kill: when it returns none
// runs another instruction of its own) and unmounts its image root, lazily, so that the
// image is free again. Waiting for their exits and removing the rest — its cgroups,
// network and user namespaces, PTY instance and user files — is Retire's; what it made in
// the lease's directory (its root's writable layer) goes with that directory, the
// caller's to remove after Retire. Tearing down an unknown or already removed lease is not
// an error.
func (s *Sandbox) Teardown(ctx context.Context, leaseID string) error {
	if !leaseIDPattern.MatchString(leaseID) {
		return fmt.Errorf("%w: lease id %q", ErrInvalid, leaseID)
	}
	s.mu.Lock()
	le := s.leases[leaseID]
	var spec LeaseSpec
	if le != nil {
		le.killed = true
		spec = le.spec
	}
	s.mu.Unlock()
	if s.cg != nil {
		if err := s.eng.Kill(ctx, leaseID); err != nil {
			return fmt.Errorf("sandbox: teardown %s: %w", leaseID, err)
		}
	}
	var err error
	if le != nil {
		err = unmountRoot(spec)
	} else {
		_, err = sweepRoots(s.rootSources, func(id string) bool { return id != leaseID })
	}
	if err != nil {
		return fmt.Errorf("sandbox: teardown %s: %w", leaseID, err)
	}
	return nil
}

// Remove is Teardown and Retire at once: for a lease no request waits on.
func (s *Sandbox) Remove(ctx context.Context, leaseID string) error {
	if err := s.Teardown(ctx, leaseID); err != nil {
		return err
	}
	return s.Retire(ctx, leaseID)
}

// Retire removes what a torn-down lease leaves: it waits for its processes' exits and
// removes its cgroups, closes its namespaces, unmounts its PTY instance (an unmount waits
// out an RCU grace period) and removes its user files. None of it is reachable once its
// processes are killed, so it runs off the release's path. Call it after Teardown; a
// retired or unknown lease is not an error, and what a crash leaves the next New sweeps.
func (s *Sandbox) Retire(ctx context.Context, leaseID string) error {
	if !leaseIDPattern.MatchString(leaseID) {
		return fmt.Errorf("%w: lease id %q", ErrInvalid, leaseID)
	}
	s.mu.Lock()
	le := s.leases[leaseID]
	delete(s.leases, leaseID)
	s.mu.Unlock()
	var errs []error
	if s.cg != nil {
		if err := s.eng.Remove(ctx, leaseID); err != nil {
			errs = append(errs, err)
		}
	}
	if le != nil && le.netns != nil {
		// The namespace goes away with its last process, all gone above.
		errs = append(errs, le.netns.Close())
	}
	if le != nil && le.userns != nil {
		errs = append(errs, le.userns.Close())
	}
	if s.ptyRoot != "" {
		errs = append(errs, removePTS(filepath.Join(s.ptyRoot, leaseID)))
	}
	errs = append(errs, s.removeUserFiles(leaseID))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox: retire %s: %w", leaseID, err)
	}
	return nil
}

// Usage reports the lease's resource use.
func (s *Sandbox) Usage(leaseID string) (Usage, error) {
	s.mu.Lock()
	le := s.leases[leaseID]
	s.mu.Unlock()
	if le == nil {
		return Usage{}, fmt.Errorf("%w: %s", ErrUnknownLease, leaseID)
	}
	if s.cg == nil {
		return Usage{}, nil
	}
	return s.eng.Usage(leaseID)
}

// Sweep removes lease cgroups the daemon no longer knows, killing their processes,
// unmounts their image roots, and forgets in-memory leases likewise; named cells
// (confine.Cell) are not leases and stay. It returns the lease ids removed and the pids
// killed.
func (s *Sandbox) Sweep(ctx context.Context, known func(leaseID string) bool) (cgroups []string, pids []int, err error) {
	s.mu.Lock()
	var forget []string
	for id := range s.leases {
		if !known(id) {
			forget = append(forget, id)
		}
	}
	s.mu.Unlock()
	var errs []error
	seen := map[string]bool{}
	for _, id := range forget {
		if err := s.Remove(ctx, id); err != nil {
			errs = append(errs, err)
		}
		seen[id] = true
	}
	roots, err := sweepRoots(s.rootSources, known)
	errs = append(errs, err)
	for _, id := range roots {
		s.log.InfoContext(ctx, "unmounted orphan lease root", "lease", id)
		if !seen[id] && !slices.Contains(forget, id) {
			forget = append(forget, id)
		}
	}
	if s.cg == nil {
		return forget, nil, errors.Join(errs...)
	}
	removed, pids, err := s.eng.Sweep(ctx, known)
	errs = append(errs, err)
	for _, id := range removed {
		if !seen[id] {
			forget = append(forget, id)
		}
	}
	return forget, pids, errors.Join(errs...)
}

// Close waits for the background work, drops the leases' launchers, removes their spare
// child cgroups and unmounts their PTY instances; the leases themselves stay, for a
// restarted daemon to adopt (Provision mounts their instances again). Call it at
// shutdown, after the last command has finished; later commands still work but start the
// plain way, keep no spares and use the host's PTYs.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	hf := s.hostFiles
	s.hostFiles = nil
	if owner := s.owner; owner != nil {
		leasesLeft := len(s.leases) > 0
		defer owner.Close(leasesLeft) // the cgroup parent is free again once the work below is done
		s.owner = nil
	}
	var pts []string
	for _, le := range s.leases {
		pts = append(pts, le.pts)
		le.pts = ""
	}
	s.mu.Unlock()
	if hf != nil {
		hf.close() // no heal while the engine closes
	}
	s.userns.close()
	var errs []error
	for _, dir := range pts {
		errs = append(errs, removePTS(dir))
	}
	return errors.Join(append(errs, s.eng.Close())...)
}
