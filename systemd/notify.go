// Package systemd is the daemon's side of the service manager protocol: readiness and
// status (sd_notify), the watchdog, and credentials passed with LoadCredential=. Without
// systemd every call is a no-op, so the daemon calls them unconditionally.
//
// It reads the environment systemd sets for the main process; lease processes must never
// inherit NOTIFY_SOCKET (the Execer gives them a clean environment, and the unit sets
// NotifyAccess=main).
package systemd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrUnsupportedSocket is returned for a $NOTIFY_SOCKET that is neither a path nor an
// abstract socket name (for instance systemd's vsock: addresses for VMs).
var ErrUnsupportedSocket = errors.New("systemd: unsupported NOTIFY_SOCKET address")

// maxStatus bounds a STATUS= text; systemd shows one line of it.
const maxStatus = 512

// Notify sends state (newline-separated VAR=value assignments) to the service manager.
// sent is false, with no error, when the process was not started with Type=notify.
func Notify(state string) (sent bool, err error) {
	name := os.Getenv("NOTIFY_SOCKET")
	if name == "" {
		return false, nil
	}
	// A leading '@' names an abstract socket; the net package maps it to the leading
	// NUL byte the kernel expects.
	if name[0] != '/' && name[0] != '@' {
		return false, fmt.Errorf("%w: %q", ErrUnsupportedSocket, name)
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("systemd: notify: %w", err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("systemd: notify: %w", err)
	}
	return true, nil
}

// Ready tells the service manager that the daemon is serving: send it once the listener
// is up and the lease state is loaded, and again after a reload.
func Ready() (bool, error) { return Notify("READY=1") }

// Stopping tells the service manager that a graceful shutdown has begun.
func Stopping() (bool, error) { return Notify("STOPPING=1") }

// Reloading tells the service manager that a reload (SIGHUP) has begun; send Ready when it
// is done. MONOTONIC_USEC lets systemd ≥ 253 match the two (Type=notify-reload).
func Reloading() (bool, error) {
	return Notify(fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", monotonicUsec()))
}

// Status sets the one-line status `systemctl status` shows. Newlines are replaced so
// that msg cannot smuggle in other assignments.
func Status(msg string) (bool, error) {
	msg = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, msg)
	if len(msg) > maxStatus {
		msg = msg[:maxStatus]
	}
	return Notify("STATUS=" + msg)
}

func monotonicUsec() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0 // cannot happen on Linux; systemd then ignores the field
	}
	return ts.Nano() / 1000
}
