package process

import (
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ParseSignal maps a signal name to its number: "TERM", "SIGTERM" and "term" are the
// same signal. Numbers are refused on purpose: names are portable, numbers are not.
// Unknown names are ErrInvalid.
func ParseSignal(name string) (syscall.Signal, error) {
	s := strings.ToUpper(strings.TrimSpace(name))
	if !strings.HasPrefix(s, "SIG") {
		s = "SIG" + s
	}
	sig := unix.SignalNum(s)
	if sig == 0 {
		return 0, fmt.Errorf("%w: unknown signal %q", ErrInvalid, name)
	}
	return sig, nil
}

// SignalName is the name of sig without "SIG" ("KILL"), or its number for signals
// without a name (real-time signals).
func SignalName(sig syscall.Signal) string {
	if n := unix.SignalName(sig); n != "" {
		return strings.TrimPrefix(n, "SIG")
	}
	return strconv.Itoa(int(sig))
}
