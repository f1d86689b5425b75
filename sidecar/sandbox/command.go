package sandbox

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/sidecar/sandbox/initproc"
)

var errNotFound = exec.ErrNotFound

// Command prepares spec to run in the lease: the returned command starts the helper, which
// enters the command's own child cgroup, the lease's namespaces, uid and Landlock policy
// before it execs argv. Bad input is ErrInvalid (ErrOutsideWorkdir for Dir), a missing
// executable wraps exec.ErrNotFound, and nothing is created for either.
//
// The caller sets Stdin/Stdout/Stderr (or starts it with creack/pty, which adds Setctty
// to the SysProcAttr set here; replacing SysProcAttr makes the helper refuse to run),
// calls Tree.Start, Wait, then Tree.Close.
func (s *Sandbox) Command(leaseID string, spec Spec) (*exec.Cmd, Tree, error) {
	s.mu.Lock()
	le := s.leases[leaseID]
	var l LeaseSpec
	var netns *os.File
	var pts, passwd, group string
	if le != nil {
		l, netns, pts, passwd, group = le.spec, le.netns, le.pts, le.passwd, le.group
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
	env, err := buildEnv(s.identity(v), tmp, spec.TTY, spec.Env)
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
	pathEnv := DefaultPath
	if p, ok := spec.Env["PATH"]; ok {
		pathEnv = p
	}
	if err := findExecutable(v, spec.Argv[0], pathEnv, dir); err != nil {
		return nil, nil, err
	}

	cfg := initproc.Config{
		Argv: spec.Argv, Env: env, Dir: dir, UID: l.UID, GID: l.GID,
		Landlock: s.landlockPolicy(l),
		Seccomp:  s.caps.Seccomp,
	}
	if s.strict() {
		// Not in isolation none: a daemon that is not root could not raise a hard limit
		// below one of these (a 1,024-file hard limit, say), and every command would fail.
		cfg.Rlimits = LeaseRlimits
	}
	attr := &syscall.SysProcAttr{Setsid: true}
	if s.caps.PrivateTmp {
		cfg.TmpDir, cfg.HostMountNS = l.TmpDir, s.hostMNS
		cfg.PTSDir = pts
		cfg.Passwd, cfg.Group, cfg.WorkDir = passwd, group, l.Workdir
		attr.Cloneflags = syscall.CLONE_NEWNS
	}
	t := &tree{s: s, leaseID: leaseID}
	if s.cg != nil {
		if t.child, err = s.takeChild(le); err != nil {
			return nil, nil, fmt.Errorf("sandbox: lease %s: child cgroup: %w", leaseID, err)
		}
		cfg.CgroupProcs = s.cg.joinFiles(leaseID, t.child)
		if d := s.cg.childDir(leaseID, t.child); d != "" {
			// v2: clone3(CLONE_INTO_CGROUP) puts the helper there atomically.
			fd, err := os.Open(d)
			if err != nil {
				t.Close()
				return nil, nil, &SetupError{Step: "join cgroup", Msg: err.Error()}
			}
			t.parentFiles = append(t.parentFiles, fd)
			attr.UseCgroupFD, attr.CgroupFD = true, int(fd.Fd())
		}
	}
	files, err := t.helperFiles(&cfg, netns)
	if err != nil {
		t.Close()
		return nil, nil, err
	}
	cmd := &exec.Cmd{
		Path: s.helper,
		Args: []string{s.helper, HelperArg},
		// The helper runs as root: it gets no environment at all (no LD_PRELOAD, GODEBUG…);
		// the target's environment travels in the config.
		Env: []string{},
		// Where the helper starts, as root, before it enters its namespace's view.
		Dir:         hostDir,
		ExtraFiles:  files,
		SysProcAttr: attr,
	}
	t.cmd = cmd
	return cmd, t, nil
}

// newChild creates the command's child cgroup, skipping names left by an earlier run.
func (s *Sandbox) newChild(le *lease) (string, error) {
	for range 1000 {
		s.mu.Lock()
		le.next++
		name := "p" + strconv.Itoa(le.next)
		s.mu.Unlock()
		err := s.cg.newChild(le.spec.ID, name)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		return name, err
	}
	return "", errors.New("no free child cgroup name")
}

// helperFiles makes the helper's descriptors 3 (config in a sealed memfd), 4 (report pipe)
// and 5 (network namespace), keeping the daemon's ends in t.
func (t *tree) helperFiles(cfg *initproc.Config, netns *os.File) ([]*os.File, error) {
	cfg.NetNS = netns != nil
	b, err := initproc.Encode(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	mfd, err := unix.MemfdCreate("sidecar-init-config", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	config := os.NewFile(uintptr(mfd), "sidecar-init-config")
	t.parentFiles = append(t.parentFiles, config)
	if _, err := config.Write(b); err != nil {
		return nil, err
	}
	if _, err := config.Seek(0, 0); err != nil {
		return nil, err
	}
	// Sealed: nothing can change the config between here and the helper reading it.
	if _, err := unix.FcntlInt(config.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL); err != nil {
		return nil, fmt.Errorf("memfd seal: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	t.report = r
	t.parentFiles = append(t.parentFiles, w)
	files := []*os.File{config, w}
	if netns != nil {
		files = append(files, netns)
	}
	return files, nil
}

// landlockPolicy is the lease's filesystem view: its workdir and /tmp read-write, system
// directories read-only (and executable where binaries live), a few devices, nothing else.
// The helper applies the best ABI the kernel has up to the cap, and in strict mode never
// less than the ABI probed at startup: what /v1/info promised.
func (s *Sandbox) landlockPolicy(l LeaseSpec) *initproc.Landlock {
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
