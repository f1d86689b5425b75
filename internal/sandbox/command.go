package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/sidecar-sandbox/sidecar/internal/confine"
	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

var errNotFound = exec.ErrNotFound

// Spec is one process to start inside a lease.
type Spec struct {
	Argv []string
	// Env is the request's environment; Command adds the clean base (PATH, HOME, USER,
	// LOGNAME, SHELL, LANG, TMPDIR; TERM for a TTY only).
	Env map[string]string
	// Dir is relative to the lease workdir, or absolute under Workspace ("" is the workdir
	// itself).
	Dir string
	TTY bool
}

// Tree is everything one command may fork: its own child cgroup (or, without cgroups, its
// process group). Package process supervises it; fakes in its tests stand in for it.
type Tree = confine.Tree

// SetupError is a step of the confinement that failed before the target ran (the
// helper's cgroup join, a mount, the uid drop, Landlock, seccomp...).
type SetupError = confine.SetupError

// Command prepares spec to run in the lease: the returned command starts the helper, which
// enters the command's own child cgroup, the lease's namespaces, uid and Landlock policy
// before it execs argv — or, when the lease has a launcher ready (package confine), hands
// the command to that helper, which did all of it ahead of time. Bad input is ErrInvalid
// (ErrOutsideWorkdir for Dir), a missing executable wraps exec.ErrNotFound, and nothing is
// created for either.
//
// The caller sets Stdin/Stdout/Stderr (or starts it with creack/pty, which adds Setctty
// to the SysProcAttr set here; replacing SysProcAttr makes the helper refuse to run),
// calls Tree.Start, Wait, then Tree.Close.
func (s *Sandbox) Command(leaseID string, spec Spec) (*exec.Cmd, Tree, error) {
	s.mu.Lock()
	le := s.liveLease(leaseID)
	var l LeaseSpec
	if le != nil {
		l = le.spec
	}
	s.mu.Unlock()
	if le == nil {
		return nil, nil, fmt.Errorf("%w: %s", ErrUnknownLease, leaseID)
	}

	v := s.view(l)
	tmp := "/tmp"
	if !s.caps.PrivateTmp {
		tmp = l.TmpDir // no mount namespace: the lease's tmp dir is used where it is
	}
	leaseEnv := imageEnv(l.Root) // PATH and the rest of the image's, then the network's
	if l.Network != nil {
		leaseEnv = append(leaseEnv, l.Network.Env...)
	}
	env, err := buildEnv(s.identity(v, l.Root), s.path, tmp, spec.TTY, leaseEnv, spec.Env)
	if err != nil {
		return nil, nil, err
	}
	if err := validateArgv(spec.Argv, env); err != nil {
		return nil, nil, err
	}
	rel, err := resolveDir(l.Workdir, spec.Dir)
	if err != nil {
		return nil, nil, err
	}
	hostDir, dir := filepath.Join(l.Workdir, rel), filepath.Join(v.work, rel)
	if err := findExecutable(v, spec.Argv[0], envValue(env, "PATH"), dir); err != nil {
		return nil, nil, err
	}

	st := s.start(le)
	st.Config.Argv, st.Config.Env, st.Config.Dir = spec.Argv, env, dir
	st.Dir, st.TTY = hostDir, spec.TTY
	cmd, t, err := s.eng.Command(leaseID, st)
	if errors.Is(err, confine.ErrInvalid) {
		err = fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return cmd, t, err
}

// start is what every process of the lease starts with: the lease-wide part of the
// helper's config, its network and user namespaces and, as where the helper starts, its
// workdir.
func (s *Sandbox) start(le *lease) confine.Start {
	s.mu.Lock()
	netns, userns, workdir := le.netns, le.userns, le.spec.Workdir
	s.mu.Unlock()
	if le.spec.Root == nil || !le.spec.Root.AsRoot {
		userns = nil // it only maps the layers: the processes stay the lease's uid
	}
	return confine.Start{Config: s.helperConfig(le), Dir: workdir, NetNS: netns, UserNS: userns, NewNS: s.caps.PrivateTmp, MountNS: s.helperNS}
}

// helperConfig is the lease-wide part of a helper's config: all but the command and its
// cgroup.
func (s *Sandbox) helperConfig(le *lease) initproc.Config {
	s.mu.Lock()
	l, pts, passwd, group, resolv := le.spec, le.pts, le.passwd, le.group, le.resolv
	root, rootRW := le.root, le.rootRW
	s.mu.Unlock()
	cfg := initproc.Config{
		UID: l.UID, GID: l.GID,
		Landlock: s.landlockPolicy(l, rootRW),
		Seccomp:  s.filter,
	}
	if s.strict() {
		// Not in isolation none: a daemon that is not root could not raise a hard limit
		// below one of these (a 1,024-file hard limit, say), and every command would fail.
		cfg.Rlimits = LeaseRlimits
	}
	if s.caps.PrivateTmp {
		cfg.TmpDir, cfg.HostMountNS = l.TmpDir, s.hostMNS
		cfg.PTSDir = pts
		cfg.Passwd, cfg.Group, cfg.WorkDir = passwd, group, l.Workdir
		cfg.Home = s.view(l).homeHost
		cfg.Resolv = resolv
		cfg.Root = root
		cfg.Detach = s.detach
	}
	if root != "" && resolv == "" {
		cfg.Resolv = hostResolvConf() // the host's network: its resolver, not the image's
	}
	return cfg
}

// hostResolvConf is the host's /etc/resolv.conf when it has one, else "".
func hostResolvConf() string {
	if _, err := os.Stat("/etc/resolv.conf"); err != nil {
		return ""
	}
	return "/etc/resolv.conf"
}

// landlockPolicy is the lease's filesystem view: its workdir and /tmp read-write, system
// directories read-only (and executable where binaries live), a few devices, nothing else.
// A lease in an image root may write wherever file modes let it there (rootRW, its
// top-level directories: the writable layer is its own), and read all of it.
// The helper applies the best ABI the kernel has up to the cap, and in strict mode never
// less than the ABI probed at startup: what /v1/info promised.
func (s *Sandbox) landlockPolicy(l LeaseSpec, rootRW []string) *initproc.Landlock {
	if s.caps.LandlockABI == 0 {
		return nil
	}
	// In the lease's mount namespace, Workspace is the workdir (the same inode: one rule
	// covers both names); without one, its host path is.
	p := &initproc.Landlock{
		RW:  []string{s.view(l).work, "/tmp"},
		RX:  systemExecDirs,
		RO:  systemReadDirs,
		Dev: deviceFiles,
	}
	if s.view(l).homeHost != "" {
		p.RW = append(p.RW, HomeMount)
	}
	if l.Root != nil {
		p.RW = append(p.RW, rootRW...)
		p.RX, p.RO = nil, []string{"/"} // ls / and the like
	}
	if s.landlockMax > 0 {
		p.MaxABI = s.landlockMax
	}
	if s.strict() {
		p.MinABI = s.caps.LandlockABI
	} else {
		p.RW = append(p.RW, l.TmpDir)
	}
	return p
}
