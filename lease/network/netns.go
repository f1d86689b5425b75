package network

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// InNetNS runs fn on a thread switched into the network namespace ns: sockets fn makes
// belong to ns for their whole life, wherever the goroutines that use them run later. If
// switching back fails, the thread stays locked and ends with its goroutine, so no other
// goroutine ever runs in the lease's namespace.
func InNetNS(ns *os.File, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter the lease's network namespace: %w", err)
			return
		}
		err = fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
