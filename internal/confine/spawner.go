package confine

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// A spawner starts the helpers that need no standard streams (zygotes, launchers made the
// plain way) for the daemon: the C helper as `sidecar-init spawn`, started with the
// engine while the daemon holds few descriptors. The daemon holds several per lease (its
// helpers' pidfds, report pipes and sockets, the lease network's sockets): a helper it
// forked itself would copy that table and close each one in its execve, a cost that grew
// with the leases held on every lease's acquire. A spawned helper is vforked from a
// process holding a handful; it is still the daemon's child (CLONE_PARENT), waited for as
// for one it started, and gets what the daemon's own start gives it: its descriptors on
// the same numbers, its own session, its directory, an empty environment, the daemon's
// mount namespace or a copy of it. One to be born in its cgroup (v2's CLONE_INTO_CGROUP,
// where clone3 is allowed) is still started by the daemon: a vfork on a stack of its own
// takes clone(2), and a plain fork of the spawner costs more than the descriptors it saves.
//
// A spawner that fails to answer is dropped, and helpers start the plain way from then on;
// one that refuses a start (a clone that failed) leaves that start to the plain way.
type spawner struct {
	proc    *os.Process
	mu      sync.Mutex // one request at a time on sock
	sock    *os.File   // nil once dropped
	started atomic.Int64
}

// spawnNewNS is the request's flag for a copy of the spawner's (the daemon's) mount
// namespace, as sidecar-init's serve_spawns reads it.
const spawnNewNS = 1

// maxSpawnSlots is serve_spawns' MAX_SPAWN_SLOTS: fds 3 to 24 of a helper.
const maxSpawnSlots = 22

var (
	errSpawner        = errors.New("spawner")
	errSpawnerDropped = fmt.Errorf("%w dropped", errSpawner)
)

// startSpawner starts helper as a spawner of `helper arg` helpers.
func startSpawner(helper, arg string) (*spawner, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w socket: %v", errSpawner, err)
	}
	ours := os.NewFile(uintptr(fds[0]), "spawner")
	theirs := os.NewFile(uintptr(fds[1]), "spawner")
	defer theirs.Close()
	cmd := &exec.Cmd{
		Path:        helper,
		Args:        []string{helper, "spawn", arg},
		Env:         []string{},
		ExtraFiles:  []*os.File{theirs},
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		ours.Close()
		return nil, fmt.Errorf("%w: %v", errSpawner, err)
	}
	return &spawner{proc: cmd.Process, sock: ours}, nil
}

// spawns says whether cmd (a helper prepared by prepareHelper) is one the spawner can
// start: no standard streams and no attribute it does not carry.
func spawns(cmd *exec.Cmd) bool {
	a := cmd.SysProcAttr
	return cmd.Stdin == nil && cmd.Stdout == nil && cmd.Stderr == nil && len(cmd.ExtraFiles) <= maxSpawnSlots &&
		a != nil && a.Setsid && !a.Setctty && !a.UseCgroupFD && a.Cloneflags&^syscall.CLONE_NEWNS == 0 && filepath.IsAbs(cmd.Dir)
}

// start starts cmd's helper and sets cmd.Process, as cmd.Start would. An error wrapping
// errSpawner means the spawner is gone, a *refusedError that it started nothing; any
// other, that the helper it started was lost.
func (s *spawner) start(cmd *exec.Cmd) error {
	var flags byte
	if cmd.SysProcAttr.Cloneflags&syscall.CLONE_NEWNS != 0 {
		flags |= spawnNewNS
	}
	msg := []byte{'s', 0, byte(len(cmd.ExtraFiles))}
	var fds []int
	for _, f := range cmd.ExtraFiles {
		if f == nil {
			msg = append(msg, '0')
			continue
		}
		msg = append(msg, '1')
		fds = append(fds, int(f.Fd()))
	}
	msg[1] = flags
	msg = append(msg, cmd.Dir...)
	pid, pidfd, err := s.request(msg, fds)
	if err != nil {
		return err
	}
	proc, err := adoptChild(pid, pidfd)
	if err != nil {
		return fmt.Errorf("spawned helper: %w", err)
	}
	cmd.Process = proc
	s.started.Add(1)
	return nil
}

// request sends one request; the answer is a zygote's (forkRequest).
func (s *spawner) request(msg []byte, fds []int) (int, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sock == nil {
		return 0, 0, errSpawnerDropped
	}
	pid, pidfd, err := forkRequest(int(s.sock.Fd()), msg, fds)
	var refused *refusedError
	if err != nil && !errors.As(err, &refused) {
		s.sock.Close()
		s.sock = nil
		return 0, 0, fmt.Errorf("%w: %v", errSpawner, err)
	}
	return pid, pidfd, err
}

// close lets the spawner go (it exits at the end of its socket) and reaps it.
func (s *spawner) close() {
	s.mu.Lock()
	if s.sock != nil {
		s.sock.Close()
		s.sock = nil
	}
	s.mu.Unlock()
	_, _ = s.proc.Wait()
}
