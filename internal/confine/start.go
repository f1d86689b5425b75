package confine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

// Start is one process tree to start in a cell, as its policy decided it.
type Start struct {
	// Config is the helper's config: everything but the cgroup to join and the presence
	// of the namespaces below, which the engine fills in.
	Config initproc.Config
	Dir    string   // where the helper starts, on the host, before it enters its view
	NetNS  *os.File // the network namespace the helper enters; nil: the host's
	UserNS *os.File // the user namespace the helper enters as root; nil: none (it drops to Config.UID)
	NewNS  bool     // the helper unshares a mount namespace of its own
	// MountNS (with NewNS) is the namespace the C helper copies for its own instead of the
	// daemon's: the daemon's without the lease roots' mounts (Config.MountNS), where every
	// bind source is under a lease root or the host's. nil, or the Go helper: the daemon's.
	MountNS *os.File
	TTY     bool
}

// SetTemplate gives cell id what its launchers are made with (Start.Config without
// argv, environment and dir; Dir where the helper starts), and starts making the first in
// the background unless the engine starts everything the plain way. template is called
// for each launcher, from the goroutine that makes it.
func (e *Engine) SetTemplate(id string, template func() Start) {
	e.mu.Lock()
	c := e.cells[id]
	if c != nil {
		c.template = template
	}
	e.mu.Unlock()
	e.refillLauncher(c, nil) // the first command's
}

// Command makes the command that starts s in cell id ("" or a cell not open: no cgroup,
// the tree is its process group). Tree.Start hands it to the cell's launcher when one is
// ready, a helper that entered its own child cgroup and the view s.Config describes ahead
// of time; else it starts a helper that does all of that before it execs the target, and
// only then makes the helper's child cgroup, config and report pipe. The caller sets
// Stdin/Stdout/Stderr (and Setctty for a terminal), calls Tree.Start, Wait, then
// Tree.Close. A config the helper would refuse is ErrInvalid here, before anything starts.
func (e *Engine) Command(id string, s Start) (*exec.Cmd, Tree, error) {
	if _, err := initproc.Encode(&s.Config); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	e.mu.Lock()
	c := e.cells[id]
	e.mu.Unlock()
	cfg := s.Config
	t := &tree{e: e, id: id, c: c, start: s, cmd: e.helperCmd(s), tty: s.TTY, ended: make(chan struct{}),
		launch: initproc.Launch{Argv: cfg.Argv, Env: cfg.Env, Dir: cfg.Dir}}
	return t.cmd, t, nil
}

// helperCmd is the helper's command for s, its config and files still to add.
func (e *Engine) helperCmd(s Start) *exec.Cmd {
	attr := &syscall.SysProcAttr{Setsid: true}
	if s.NewNS {
		attr.Cloneflags = syscall.CLONE_NEWNS
	}
	return &exec.Cmd{
		Path: e.helper,
		Args: []string{e.helper, e.helperArg},
		// The helper runs as root: it gets no environment at all (no LD_PRELOAD, GODEBUG…);
		// the target's environment travels in the config.
		Env:         []string{},
		Dir:         s.Dir,
		SysProcAttr: attr,
	}
}

// prepareHelper completes cmd for the helper of s in child cgroup child of cell id ("":
// none); extra is the launch socket of a launcher (nil otherwise). It returns the
// daemon's copies of what the helper inherits, to close once it has started, and the read
// end of its report pipe.
func (e *Engine) prepareHelper(id string, cmd *exec.Cmd, s Start, child string, extra *os.File) (parentFiles []*os.File, report *os.File, err error) {
	defer func() {
		if err != nil {
			closeAll(parentFiles)
			if report != nil {
				report.Close()
			}
			parentFiles, report = nil, nil
		}
	}()
	cfg := s.Config
	if child != "" {
		cfg.CgroupProcs = e.cg.JoinFiles(id, child)
		if d := e.cg.ChildDir(id, child); d != "" {
			// v2: clone3(CLONE_INTO_CGROUP) puts the helper there atomically.
			fd, err := os.Open(d)
			if err != nil {
				return nil, nil, &SetupError{Step: "join cgroup", Msg: err.Error()}
			}
			parentFiles = append(parentFiles, fd)
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(fd.Fd())
		}
	}
	cfg.NetNS, cfg.UserNS = s.NetNS != nil, s.UserNS != nil
	var trees []*os.File
	if s.NewNS && s.MountNS != nil && e.forks {
		if trees, err = openTrees(&cfg); err != nil {
			return parentFiles, nil, err
		}
		parentFiles = append(parentFiles, trees...)
		cmd.SysProcAttr.Cloneflags &^= syscall.CLONE_NEWNS // the helper makes its own from MountNS
	}
	b, err := initproc.Encode(&cfg)
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
	// At initproc's descriptor numbers; a nil entry is closed in the helper.
	cmd.ExtraFiles = []*os.File{config, w, s.NetNS, extra, s.UserNS}
	if cfg.MountNS {
		cmd.ExtraFiles = append(cmd.ExtraFiles, s.MountNS)
		cmd.ExtraFiles = append(cmd.ExtraFiles, trees...)
	}
	return parentFiles, r, nil
}

// openTrees sets cfg.MountNS and cfg.Trees and opens the trees: a detached copy of each of
// the helper's bind sources under the lease roots, which the helper puts back in its
// view's namespace (initproc.Config.Trees).
func openTrees(cfg *initproc.Config) ([]*os.File, error) {
	cfg.MountNS, cfg.Trees = true, nil
	var trees []*os.File
	for _, src := range cfg.BindSources() {
		flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC
		if src.Recursive {
			flags |= unix.AT_RECURSIVE
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, src.Path, uint(flags))
		if err != nil {
			closeAll(trees)
			return nil, &SetupError{Step: "copy bind source", Msg: fmt.Sprintf("open_tree %s: %v", src.Path, err)}
		}
		cfg.Trees = append(cfg.Trees, src.Path)
		trees = append(trees, os.NewFile(uintptr(fd), src.Path))
	}
	return trees, nil
}

// startHelper starts a prepared helper, through the spawner when it can, and closes the
// daemon's copies of its files.
func (e *Engine) startHelper(id string, cmd *exec.Cmd, child string, parentFiles []*os.File) error {
	spawned, err := e.spawn(cmd)
	if !spawned {
		err = cmd.Start()
	}
	closeAll(parentFiles)
	if err != nil && cmd.SysProcAttr.UseCgroupFD {
		if _, serr := os.Stat(e.cg.ChildDir(id, child)); serr != nil {
			// v2: clone3 could not enter a child cgroup removed under it.
			return &SetupError{Step: "join cgroup", Msg: err.Error()}
		}
	}
	return err
}

// spawn starts cmd through the spawner; false when the spawner started nothing and the
// daemon must. A helper the spawner started but lost (reaped before its pidfd came back)
// is an error, not started again.
func (e *Engine) spawn(cmd *exec.Cmd) (bool, error) {
	if e.spawner == nil || !spawns(cmd) {
		return false, nil
	}
	err := e.spawner.start(cmd)
	var refused *refusedError
	switch {
	case errors.Is(err, errSpawnerDropped), errors.As(err, &refused):
		return false, nil
	case errors.Is(err, errSpawner):
		e.log.Warn("the helper spawner failed: helpers are started by the daemon itself from now on", "err", err)
		return false, nil
	}
	return true, err
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
