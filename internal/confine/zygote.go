package confine

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sidecar-sandbox/sidecar/internal/confine/initproc"
)

// A zygote makes a cell's launchers by forking. Making a launcher the plain way costs a
// fork of the daemon, an exec of the helper, a mount namespace copied (Start.MountNS) and
// the cell's mounts made again, then torn down when the command ends. A zygote is the C helper started once per cell with "await fork": it joins its
// own child cgroup and the cell's network namespace, makes the cell's mount namespace and
// mounts, and stays, root and unconfined, in that view. Each launcher is then a fork of
// it (clone3 with CLONE_PARENT: the daemon's child, which it waits for as for one it
// started) that takes only the process's own steps: its cgroup (v2: born in it; v1: it
// writes itself into cgroup.procs files the daemon opened), a cgroup namespace, resource
// limits, the uid, Landlock and seccomp. Every launcher of a cell shares the zygote's
// mount namespace, where none of them can mount.
//
// Only the daemon holds the zygote's socket, and it runs as root where the lease's uid
// cannot signal or trace it; it is one process and about 0.4 MiB of the cell's memory
// (its mounts included), left out of Usage like a launcher. A zygote that fails is
// dropped and the cell's launchers are made the plain way; after maxLauncherFailures in a
// row, the cell makes no more zygotes.

// errZygote: the zygote did not answer a request as it should (it died, say): it is
// dropped.
var errZygote = errors.New("zygote")

// zygoteWait bounds a zygote's set-up and each answer it gives: a zygote is the daemon's
// own helper, so a silent one is broken, not slow.
const zygoteWait = 10 * time.Second

type zygote struct {
	child  string // its child cgroup
	proc   *os.Process
	report *os.File // read end of its report pipe
	key    []byte   // the template it was made with: another retires it
	netns  *os.File
	userns *os.File

	mu   sync.Mutex // one request at a time on sock
	sock *os.File   // nil once dropped
}

// zygoteFor returns the cell's zygote for template st, making one when the cell has none
// or its template changed; nil when the helper cannot fork or the cell's zygotes keep
// failing. Called only from the goroutine making the cell's launcher.
func (e *Engine) zygoteFor(c *cell, st Start) *zygote {
	if !e.forks {
		return nil
	}
	cfg := st.Config
	cfg.Await, cfg.Fork = true, true
	key, err := initproc.Encode(&cfg)
	if err != nil {
		return nil
	}
	e.mu.Lock()
	z, failures := c.zygote, c.zygoteFailures
	e.mu.Unlock()
	if z != nil && string(z.key) == string(key) && z.netns == st.NetNS && z.userns == st.UserNS {
		return z
	}
	if z != nil {
		e.dropZygote(c)
	}
	if failures >= maxLauncherFailures {
		return nil
	}
	z, err = e.startZygote(c, st, key)
	e.mu.Lock()
	live := e.live(c.id) == c
	if err != nil {
		c.zygoteFailures++
		failures = c.zygoteFailures
	} else if live {
		c.zygote = z
	}
	e.mu.Unlock()
	switch {
	case err != nil:
		e.log.Debug("zygote failed: launchers of this cell are made the plain way", "cell", c.id, "err", err, "failures", failures)
		return nil
	case !live: // the cell went meanwhile
		e.endZygote(c.id, z)
		return nil
	}
	return z
}

// startZygote starts the helper as a zygote in a new child cgroup and waits until it is
// ready.
func (e *Engine) startZygote(c *cell, st Start, key []byte) (*zygote, error) {
	child, err := e.takeChild(c.id)
	if err != nil {
		return nil, fmt.Errorf("child cgroup: %w", err)
	}
	z := &zygote{child: child, key: key, netns: st.NetNS, userns: st.UserNS}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		e.dropChild(c.id, child)
		return nil, fmt.Errorf("zygote socket: %w", err)
	}
	z.sock = os.NewFile(uintptr(fds[0]), "zygote")
	theirs := os.NewFile(uintptr(fds[1]), "zygote")
	st.Config.Await, st.Config.Fork = true, true
	cmd := e.helperCmd(st)
	parentFiles, report, err := e.prepareHelper(c.id, cmd, st, child, theirs)
	if err == nil {
		z.report = report
		err = e.startHelper(c.id, cmd, child, parentFiles)
	}
	// The zygote holds its end now: with ours closed, a zygote that exits during its
	// set-up ends the wait below at once instead of after zygoteWait.
	theirs.Close()
	if err == nil {
		z.proc = cmd.Process
		var ready bool
		if ready, err = awaitReady(z.sock, zygoteWait); !ready && err == nil {
			err = errors.New("not ready in time")
		}
	}
	if err != nil {
		if z.proc != nil {
			_ = z.proc.Kill() // its report pipe ends with it
		}
		if z.report != nil {
			if b, _ := io.ReadAll(io.LimitReader(z.report, 4096)); len(b) > 0 {
				err = fmt.Errorf("%w: %s", err, b)
			}
		}
		e.endZygote(c.id, z)
		return nil, err
	}
	return z, nil
}

// forkLauncher has the cell's zygote z fork launcher l in l.child, and fills in its
// process, launch socket and report pipe. What goes to the zygote is opened with bare
// system calls: as files they would be added to the runtime's poller and taken out again.
func (e *Engine) forkLauncher(c *cell, z *zygote, l *launcher) (err error) {
	var keep []*os.File
	var send []int
	defer func() {
		for _, fd := range send {
			unix.Close(fd)
		}
		if err != nil {
			closeAll(keep)
		}
	}()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("launch socket: %w", err)
	}
	sock := os.NewFile(uintptr(pair[0]), "launch")
	keep, send = append(keep, sock), append(send, pair[1])
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("report pipe: %w", err)
	}
	send = append(send, pipe[1])
	if err := unix.SetNonblock(pipe[0], true); err != nil { // read through the poller
		unix.Close(pipe[0])
		return fmt.Errorf("report pipe: %w", err)
	}
	report := os.NewFile(uintptr(pipe[0]), "report")
	keep = append(keep, report)
	kind, paths, flags := byte('f'), e.cg.ForkJoinFiles(c.id, l.child), unix.O_WRONLY
	if d := e.cg.ChildDir(c.id, l.child); d != "" {
		kind, paths, flags = 'c', []string{d}, unix.O_PATH|unix.O_DIRECTORY
	}
	for _, p := range paths {
		fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
		if err != nil {
			return &SetupError{Step: "join cgroup", Msg: (&os.PathError{Op: "open", Path: p, Err: err}).Error()}
		}
		send = append(send, fd)
	}
	pid, pidfd, err := z.request(kind, send)
	if err != nil {
		return err
	}
	proc, err := adoptChild(pid, pidfd)
	if err != nil {
		return fmt.Errorf("forked launcher: %w", err)
	}
	l.proc, l.sock, l.report = proc, sock, report
	e.mu.Lock()
	c.zygoteFailures = 0
	e.mu.Unlock()
	return nil
}

// request sends one fork request and returns the child's pid and pidfd.
func (z *zygote) request(kind byte, fds []int) (int, int, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.sock == nil {
		return 0, 0, fmt.Errorf("%w dropped", errZygote)
	}
	pid, pidfd, err := forkRequest(int(z.sock.Fd()), []byte{kind}, fds)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %v", errZygote, err)
	}
	return pid, pidfd, nil
}

// adoptChild is the process of a child another process cloned for the daemon
// (CLONE_PARENT), from the pid and pidfd it answered; it closes pidfd. The reaper leaves
// a child alone once a pidfd of it is held: if it is not reaped yet, the pid is still its
// own.
func adoptChild(pid, pidfd int) (*os.Process, error) {
	defer unix.Close(pidfd)
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil); err != nil {
		return nil, fmt.Errorf("child %d: %w", pid, err)
	}
	return os.FindProcess(pid)
}

// refusedError is a fork request answered "E<message>": nothing was started.
type refusedError struct{ msg string }

func (e *refusedError) Error() string { return e.msg }

// forkRequest sends msg and fds on sock, a zygote's or the spawner's, and reads the
// answer: "P<pid>" with the child's pidfd, or "E<message>" (a *refusedError).
func forkRequest(sock int, msg []byte, fds []int) (int, int, error) {
	if err := unix.Sendmsg(sock, msg, unix.UnixRights(fds...), nil, 0); err != nil {
		return 0, 0, err
	}
	if ready, err := awaitReadable(sock, zygoteWait); !ready {
		return 0, 0, fmt.Errorf("no answer: %v", err)
	}
	buf := make([]byte, 256)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
	switch {
	case err != nil:
		return 0, 0, err
	case n == 0:
		return 0, 0, errors.New("exited")
	case buf[0] == 'E':
		return 0, 0, &refusedError{string(buf[1:n])}
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	var rights []int
	if err == nil && len(msgs) == 1 {
		rights, err = unix.ParseUnixRights(&msgs[0])
	}
	if err != nil || len(rights) != 1 || buf[0] != 'P' {
		for _, fd := range rights {
			unix.Close(fd)
		}
		return 0, 0, errors.New("bad answer")
	}
	pid, err := strconv.Atoi(string(buf[1:n]))
	if err != nil || pid <= 0 {
		unix.Close(rights[0])
		return 0, 0, errors.New("bad answer")
	}
	return pid, rights[0], nil
}

// Heal has every cell's zygote bind the cell's own files again where the host renamed
// over its file, which detached the bind in every mount namespace (the helper's
// heal_user_files): the cell's processes see them again without waiting for the next
// launcher. A zygote that does not answer is dropped.
func (e *Engine) Heal() {
	type pair struct {
		c *cell
		z *zygote
	}
	var zs []pair
	e.mu.Lock()
	for _, c := range e.cells {
		if c.zygote != nil {
			zs = append(zs, pair{c, c.zygote})
		}
	}
	e.mu.Unlock()
	for _, p := range zs {
		if err := p.z.heal(); err != nil {
			e.log.Warn("zygote failed to heal its cell's files: dropped", "cell", p.c.id, "err", err)
			e.zygoteFailed(p.c, p.z)
		}
	}
}

// heal sends 'h' and waits for "H".
func (z *zygote) heal() error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.sock == nil {
		return nil // dropped meanwhile
	}
	sock := int(z.sock.Fd())
	if err := unix.Sendmsg(sock, []byte{'h'}, nil, nil, 0); err != nil {
		return fmt.Errorf("%w: %v", errZygote, err)
	}
	if ready, err := awaitReadable(sock, zygoteWait); !ready {
		return fmt.Errorf("%w: no answer: %v", errZygote, err)
	}
	var buf [1]byte
	switch n, _, _, _, err := unix.Recvmsg(sock, buf[:], nil, unix.MSG_DONTWAIT); {
	case err != nil:
		return fmt.Errorf("%w: %v", errZygote, err)
	case n == 0:
		return fmt.Errorf("%w exited", errZygote)
	case buf[0] != 'H':
		return fmt.Errorf("%w: bad answer", errZygote)
	}
	return nil
}

// awaitReadable waits up to d for fd to be readable (or hung up).
func awaitReadable(fd int, d time.Duration) (bool, error) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, int(d/time.Millisecond))
		if err == unix.EINTR {
			continue
		}
		return n > 0, err
	}
}

// forkNow forks a launcher for a command that found none ready, when the cell has a
// zygote: nil, nil without one or when the zygote failed (the command then starts the
// plain way); a *SetupError when the launcher's cgroup could not be given to it. The
// command is sent at once: the launcher reads it once it is ready, and a set-up that
// fails is reported as a plain start's (Tree.Start reads the report).
func (e *Engine) forkNow(c *cell) (*launcher, error) {
	e.mu.Lock()
	z := c.zygote
	e.mu.Unlock()
	if z == nil {
		return nil, nil
	}
	child, err := e.takeChild(c.id)
	if err != nil {
		return nil, fmt.Errorf("confine: cell %s: child cgroup: %w", c.id, err)
	}
	l := &launcher{child: child}
	if err = e.forkLauncher(c, z, l); err == nil {
		return l, nil
	}
	e.discardLauncher(c, l)
	switch {
	case errors.Is(err, errZygote):
		e.log.Debug("zygote failed: the plain way", "cell", c.id, "err", err)
		e.zygoteFailed(c, z)
	case errors.As(err, new(*SetupError)):
		return nil, err
	}
	return nil, nil
}

// zygoteFailed counts a failure of the cell's zygote z and drops it; the next launcher
// makes another, up to maxLauncherFailures in a row.
func (e *Engine) zygoteFailed(c *cell, z *zygote) {
	e.mu.Lock()
	current := c.zygote == z
	if current {
		c.zygote = nil
		c.zygoteFailures++
	}
	e.mu.Unlock()
	if current {
		e.endZygote(c.id, z)
	}
}

// dropZygote ends the cell's zygote, if it has one.
func (e *Engine) dropZygote(c *cell) {
	e.mu.Lock()
	z := c.zygote
	c.zygote = nil
	e.mu.Unlock()
	if z != nil {
		e.endZygote(c.id, z)
	}
}

// endZygote lets zygote z go (it exits at the end of its socket), reaps it and removes
// its cgroup.
func (e *Engine) endZygote(id string, z *zygote) {
	z.mu.Lock()
	if z.sock != nil {
		z.sock.Close()
		z.sock = nil
	}
	z.mu.Unlock()
	if z.proc != nil {
		_ = z.proc.Kill()
		_, _ = z.proc.Wait()
	}
	if z.report != nil {
		z.report.Close()
	}
	if err := e.dropChild(id, z.child); err != nil {
		e.log.Warn("remove zygote cgroup", "cell", id, "cgroup", z.child, "err", err)
	}
}
