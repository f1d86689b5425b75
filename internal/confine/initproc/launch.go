package initproc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// A launcher is a helper started ahead of its command (Config.Await): it joins its cgroup
// and namespaces, mounts, drops privileges and applies Landlock and seccomp as for any
// command, then writes LaunchReady on LaunchFD and waits there for one message:
//
//	one byte, LaunchPipes or LaunchTTY (make stdin the controlling terminal), and four
//	descriptors (SCM_RIGHTS): a sealed memfd holding the command (EncodeLaunch), then
//	stdin, stdout and stderr.
//
// It takes them on 0-2, enters the command's directory and execs it: the command's start
// has no fork, cgroup move, mount or filter build on its path. End of file instead of a
// message means the daemon let the launcher go: it exits 0. Failures are reported on
// ReportFD as before a plain start.
const (
	LaunchReady = 'R'
	LaunchPipes = 'p'
	LaunchTTY   = 't'
)

// Launch is the command a launcher is given.
type Launch struct {
	Argv []string
	Env  []string
	Dir  string
}

// EncodeLaunch writes l in the config format, with argv, env and dir keys only.
func EncodeLaunch(l Launch) ([]byte, error) {
	if len(l.Argv) == 0 || l.Argv[0] == "" {
		return nil, fmt.Errorf("%w: empty argv", errConfig)
	}
	var b strings.Builder
	b.WriteString(configMagic + "\x00")
	put := func(key string, values ...string) error {
		for _, v := range values {
			if strings.IndexByte(v, 0) >= 0 {
				return fmt.Errorf("%w: NUL in %s", errConfig, key)
			}
			b.WriteString(key + "\x00" + v + "\x00")
		}
		return nil
	}
	err := errors.Join(put(keyArgv, l.Argv...), put(keyEnv, l.Env...))
	if l.Dir != "" {
		err = errors.Join(err, put(keyDir, l.Dir))
	}
	if err != nil {
		return nil, err
	}
	if b.Len() > MaxConfigSize {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", errConfig, b.Len(), MaxConfigSize)
	}
	return []byte(b.String()), nil
}

// DecodeLaunch parses what EncodeLaunch wrote, refusing any other key.
func DecodeLaunch(b []byte) (*Launch, error) {
	if len(b) == 0 || b[len(b)-1] != 0 {
		return nil, fmt.Errorf("%w: not NUL-terminated", errConfig)
	}
	fields := strings.Split(string(b[:len(b)-1]), "\x00")
	if fields[0] != configMagic || len(fields)%2 != 1 {
		return nil, fmt.Errorf("%w: no magic or a key without value", errConfig)
	}
	var l Launch
	seenDir := false
	for i := 1; i < len(fields); i += 2 {
		switch key, v := fields[i], fields[i+1]; key {
		case keyArgv:
			l.Argv = append(l.Argv, v)
		case keyEnv:
			l.Env = append(l.Env, v)
		case keyDir:
			if seenDir {
				return nil, fmt.Errorf("%w: dir twice", errConfig)
			}
			l.Dir, seenDir = v, true
		default:
			return nil, fmt.Errorf("%w: %q in a launched command", errConfig, key)
		}
	}
	if len(l.Argv) == 0 || l.Argv[0] == "" {
		return nil, fmt.Errorf("%w: empty argv", errConfig)
	}
	return &l, nil
}

// awaitLaunch is a launcher's wait (above): it fills cfg's Argv, Env and Dir from the
// message and enters Dir. Everything here is allowed by the seccomp filter in force.
func awaitLaunch(cfg *Config) error {
	if _, err := unix.Write(LaunchFD, []byte{LaunchReady}); err != nil {
		return fmt.Errorf("launch: ready: %w", err)
	}
	kind := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	var n, oobn, flags int
	var err error
	for {
		n, oobn, flags, _, err = unix.Recvmsg(LaunchFD, kind, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("launch: receive: %w", err)
	case n == 0:
		os.Exit(0) // the daemon let this launcher go
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	var fds []int
	if err == nil && len(msgs) == 1 {
		fds, err = unix.ParseUnixRights(&msgs[0])
	}
	if err != nil || len(fds) != 4 || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || kind[0] != LaunchPipes && kind[0] != LaunchTTY {
		return errors.New("launch: bad message")
	}
	// 0-2 are the launcher's /dev/null, so the received descriptors are all above 2.
	for i, fd := range fds[1:] {
		if err := unix.Dup2(fd, i); err != nil {
			return fmt.Errorf("launch: descriptor %d: %w", i, err)
		}
		unix.Close(fd)
	}
	if kind[0] == LaunchTTY {
		if err := unix.IoctlSetInt(0, unix.TIOCSCTTY, 0); err != nil {
			return fmt.Errorf("launch: controlling terminal: %w", err)
		}
	}
	b, err := readSealed(fds[0])
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	l, err := DecodeLaunch(b)
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	cfg.Argv, cfg.Env, cfg.Dir = l.Argv, l.Env, l.Dir
	if cfg.Dir != "" {
		if err := unix.Chdir(cfg.Dir); err != nil {
			return fmt.Errorf("chdir %s: %w", cfg.Dir, err)
		}
	}
	unix.Close(LaunchFD)
	return nil
}

// readSealed reads a sealed memfd (one that could still change is refused) and closes it.
func readSealed(fd int) ([]byte, error) {
	f := os.NewFile(uintptr(fd), "config")
	defer f.Close()
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("config seals: %w", err)
	}
	if want := unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK; seals&want != want {
		return nil, errors.New("config is not sealed")
	}
	return io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
}
