package sandbox

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// newNetNS makes a network namespace with only loopback, up, and returns a descriptor
// that keeps it alive; helpers setns into it, so all processes of a lease share one
// namespace (a server and an exec can talk over 127.0.0.1). Nothing is bind-mounted on
// the host: the namespace lives as long as this descriptor or one of its processes.
//
// The namespace is made on a locked thread that switches back afterwards; if switching
// back fails the thread stays locked and dies with its goroutine, so no other goroutine
// ever runs in the wrong namespace.
func newNetNS() (*os.File, error) {
	type result struct {
		ns  *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		ns, restored, err := unshareNetNS()
		if restored {
			runtime.UnlockOSThread()
		}
		ch <- result{ns, err}
	}()
	r := <-ch
	return r.ns, r.err
}

func unshareNetNS() (ns *os.File, restored bool, err error) {
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, true, err
	}
	defer orig.Close()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("unshare: %w", err)
	}
	defer func() {
		restored = unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil
		if !restored && err == nil {
			ns.Close()
			ns, err = nil, fmt.Errorf("restore the daemon's network namespace")
		}
	}()
	if ns, err = os.Open("/proc/thread-self/ns/net"); err != nil {
		return nil, false, err
	}
	if err := loopbackUp(); err != nil {
		ns.Close()
		return nil, false, err
	}
	return ns, false, nil
}

func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}
