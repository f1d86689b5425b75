package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

var errNotFound = exec.ErrNotFound

// Command prepares spec to run in the lease: the returned command starts the helper, which
// enters the command's own child cgroup, the lease's namespaces, uid and Landlock policy
// before it execs argv — or, when the lease has a launcher ready (launcher.go), hands the
// command to that helper, which did all of it ahead of time. Bad input is ErrInvalid
// (ErrOutsideWorkdir for Dir), a missing executable wraps exec.ErrNotFound, and nothing is
// created for either.
//
// The caller sets Stdin/Stdout/Stderr (or starts it with creack/pty, which adds Setctty
// to the SysProcAttr set here; replacing SysProcAttr makes the helper refuse to run),
// calls Tree.Start, Wait, then Tree.Close.
func (s *Sandbox) Command(leaseID string, spec Spec) (*exec.Cmd, Tree, error) {
	s.mu.Lock()
	le := s.leases[leaseID]
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
	env, err := buildEnv(s.identity(v), s.path, tmp, spec.TTY, leaseEnv, spec.Env)
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

	cfg := s.helperConfig(le)
	cfg.Argv, cfg.Env, cfg.Dir = spec.Argv, env, dir
	cmd := &exec.Cmd{
		Path: s.helper,
		Args: []string{s.helper, HelperArg},
		// The helper runs as root: it gets no environment at all (no LD_PRELOAD, GODEBUG…);
		// the target's environment travels in the config.
		Env: []string{},
		// Where the helper starts, as root, before it enters its namespace's view.
		Dir:         hostDir,
		SysProcAttr: s.helperAttr(),
	}
	t := &tree{s: s, leaseID: leaseID, le: le, cmd: cmd, tty: spec.TTY, ended: make(chan struct{}),
		launch: initproc.Launch{Argv: spec.Argv, Env: env, Dir: dir}}
	if s.cg != nil {
		if t.child, err = s.eng.TakeChild(leaseID); err != nil {
			return nil, nil, fmt.Errorf("sandbox: lease %s: child cgroup: %w", leaseID, err)
		}
	}
	// Ready for cmd.Start too (tests use it): Tree.Start may still give the command to a
	// launcher instead, and then undoes this.
	if t.parentFiles, t.report, err = s.prepareHelper(le, cmd, &cfg, t.child, nil); err != nil {
		t.Close()
		return nil, nil, err
	}
	return cmd, t, nil
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
		Seccomp:  s.caps.Seccomp,
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

func (s *Sandbox) helperAttr() *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Setsid: true}
	if s.caps.PrivateTmp {
		attr.Cloneflags = syscall.CLONE_NEWNS
	}
	return attr
}

// prepareHelper completes cmd for the helper with config cfg in child cgroup child ("":
// none); extra is the launch socket of a launcher (nil otherwise). It returns the daemon's
// copies of what the helper inherits, to close once it has started, and the read end of
// its report pipe.
func (s *Sandbox) prepareHelper(le *lease, cmd *exec.Cmd, cfg *initproc.Config, child string, extra *os.File) (parentFiles []*os.File, report *os.File, err error) {
	defer func() {
		if err != nil {
			closeAll(parentFiles)
			if report != nil {
				report.Close()
			}
			parentFiles, report = nil, nil
		}
	}()
	if child != "" {
		cfg.CgroupProcs = s.cg.JoinFiles(le.spec.ID, child)
		if d := s.cg.ChildDir(le.spec.ID, child); d != "" {
			// v2: clone3(CLONE_INTO_CGROUP) puts the helper there atomically.
			fd, err := os.Open(d)
			if err != nil {
				return nil, nil, &SetupError{Step: "join cgroup", Msg: err.Error()}
			}
			parentFiles = append(parentFiles, fd)
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(fd.Fd())
		}
	}
	s.mu.Lock()
	netns := le.netns
	s.mu.Unlock()
	cfg.NetNS = netns != nil
	b, err := initproc.Encode(cfg)
	if err != nil {
		return parentFiles, nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	config, err := sealedMemfd("sidecar-init-config", b)
	if err != nil {
		return parentFiles, nil, err
	}
	parentFiles = append(parentFiles, config)
	r, w, err := os.Pipe()
	if err != nil {
		return parentFiles, nil, err
	}
	parentFiles = append(parentFiles, w)
	cmd.ExtraFiles = []*os.File{config, w, netns} // a nil netns: fd 5 closed
	if extra != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, extra)
	}
	return parentFiles, r, nil
}

// startHelper starts a prepared helper and closes the daemon's copies of its files.
func (s *Sandbox) startHelper(le *lease, cmd *exec.Cmd, child string, parentFiles []*os.File) error {
	err := cmd.Start()
	closeAll(parentFiles)
	if err != nil && cmd.SysProcAttr.UseCgroupFD {
		if _, serr := os.Stat(s.cg.ChildDir(le.spec.ID, child)); serr != nil {
			// v2: clone3 could not enter a child cgroup removed under it.
			return &SetupError{Step: "join cgroup", Msg: err.Error()}
		}
	}
	return err
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// sealedMemfd is b in a sealed memfd: nothing can change it between here and the helper
// reading it.
func sealedMemfd(name string, b []byte) (*os.File, error) {
	mfd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(mfd), name)
	_, err = f.Write(b)
	if err == nil {
		_, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL)
	}
	if err == nil {
		_, err = f.Seek(0, 0)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd: %w", err)
	}
	return f, nil
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
