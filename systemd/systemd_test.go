package systemd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listen opens a unixgram socket playing systemd and points $NOTIFY_SOCKET at it.
func listen(t *testing.T, name string) *net.UnixConn {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", name)
	return conn
}

// receive reads one datagram, failing the test if none arrives in time.
func receive(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return string(buf[:n])
}

func TestNotifyMessages(t *testing.T) {
	for _, socket := range []string{"path", "abstract"} {
		t.Run(socket, func(t *testing.T) {
			name := filepath.Join(t.TempDir(), "notify.sock")
			if socket == "abstract" {
				name = fmt.Sprintf("@sidecar-%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), os.Getpid())
			}
			conn := listen(t, name)
			for _, tc := range []struct {
				send func() (bool, error)
				want string
			}{
				{Ready, "READY=1"},
				{Stopping, "STOPPING=1"},
				{func() (bool, error) { return Status("serving 3 leases") }, "STATUS=serving 3 leases"},
				{func() (bool, error) { return Status("two\nREADY=1") }, "STATUS=two READY=1"},
				{func() (bool, error) { return Notify("ERRNO=5\nSTATUS=x") }, "ERRNO=5\nSTATUS=x"},
			} {
				sent, err := tc.send()
				if !sent || err != nil {
					t.Fatalf("sent=%v err=%v", sent, err)
				}
				if got := receive(t, conn); got != tc.want {
					t.Errorf("got %q, want %q", got, tc.want)
				}
			}
		})
	}
}

func TestReloadingCarriesMonotonicTime(t *testing.T) {
	conn := listen(t, filepath.Join(t.TempDir(), "notify.sock"))
	before := monotonicUsec()
	if sent, err := Reloading(); !sent || err != nil {
		t.Fatalf("sent=%v err=%v", sent, err)
	}
	after := monotonicUsec()
	got := receive(t, conn)
	usec, ok := strings.CutPrefix(got, "RELOADING=1\nMONOTONIC_USEC=")
	n, err := strconv.ParseInt(usec, 10, 64)
	if !ok || err != nil || n < before || n > after {
		t.Errorf("got %q, want RELOADING=1 and MONOTONIC_USEC in [%d, %d]", got, before, after)
	}
}

func TestNotifyWithoutSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	if sent, err := Ready(); sent || err != nil {
		t.Errorf("no socket: sent=%v err=%v, want a silent no-op", sent, err)
	}
	t.Setenv("NOTIFY_SOCKET", "vsock:2:1234")
	if _, err := Ready(); !errors.Is(err, ErrUnsupportedSocket) {
		t.Errorf("vsock: %v, want ErrUnsupportedSocket", err)
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "gone.sock"))
	if sent, err := Ready(); sent || err == nil {
		t.Errorf("missing socket: sent=%v err=%v, want an error", sent, err)
	}
}

func TestWatchdogInterval(t *testing.T) {
	self := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		usec, pid string
		want      time.Duration
		ok        bool
	}{
		{"30000000", "", 30 * time.Second, true},
		{"30000000", self, 30 * time.Second, true},
		{"30000000", "1", 0, false}, // meant for another process
		{"", "", 0, false},
		{"0", "", 0, false},
		{"-5", "", 0, false},
		{"soon", "", 0, false},
		{"99999999999999999999", "", 0, false},
	} {
		t.Setenv("WATCHDOG_USEC", tc.usec)
		t.Setenv("WATCHDOG_PID", tc.pid)
		d, ok := WatchdogInterval()
		if d != tc.want || ok != tc.ok {
			t.Errorf("USEC=%q PID=%q: %v %v, want %v %v", tc.usec, tc.pid, d, ok, tc.want, tc.ok)
		}
	}
}

// TestWatchdogPingsOnlyWhileHealthy scripts healthy()'s answers and checks that exactly
// the healthy ticks produced a ping. Datagrams from one sender arrive in order, so when
// the ping of the last tick arrives, every earlier ping has arrived too.
func TestWatchdogPingsOnlyWhileHealthy(t *testing.T) {
	conn := listen(t, filepath.Join(t.TempDir(), "notify.sock"))
	t.Setenv("WATCHDOG_USEC", "2000") // a ping every millisecond
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))

	script := []bool{true, false, false, true, false, true}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	healthy := func() bool {
		if calls >= len(script) {
			cancel()
			return false
		}
		h := script[calls]
		calls++
		return h
	}
	var logs bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunWatchdog(ctx, healthy, slog.New(slog.NewTextHandler(&logs, nil)))
	}()
	want := 0
	for _, h := range script {
		if h {
			want++
		}
	}
	for range want {
		if got := receive(t, conn); got != "WATCHDOG=1" {
			t.Fatalf("got %q", got)
		}
	}
	<-done
	// RunWatchdog has returned, so anything extra is already queued: peek without waiting.
	if n := pending(t, conn); n >= 0 {
		t.Errorf("an unhealthy tick sent a ping (%d bytes extra)", n)
	}
	// Each change of health is logged once: 3 turns to unhealthy, 2 recoveries.
	if w, r := strings.Count(logs.String(), "withholding"), strings.Count(logs.String(), "resuming"); w != 3 || r != 2 {
		t.Errorf("logged %d withholds and %d resumes, want 3 and 2:\n%s", w, r, logs.String())
	}
}

// pending returns the size of a queued datagram, or -1 when none is queued.
func pending(t *testing.T, conn *net.UnixConn) int {
	t.Helper()
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := -1
	err = raw.Read(func(fd uintptr) bool {
		m, _, rerr := unix.Recvfrom(int(fd), make([]byte, 64), unix.MSG_DONTWAIT)
		if rerr == nil {
			n = m
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestWatchdogDisabledReturnsAtOnce(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "1000000")
	t.Setenv("WATCHDOG_PID", "1")
	RunWatchdog(context.Background(), func() bool { t.Error("healthy called"); return true }, nil)
}

func TestCredential(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "auth-token"), []byte("s3cret-token\n"), 0o400)
	os.WriteFile(filepath.Join(dir, "big"), make([]byte, MaxCredential+1), 0o400)
	os.Mkdir(filepath.Join(dir, "sub"), 0o700)

	t.Setenv("CREDENTIALS_DIRECTORY", "")
	if v, ok, err := Credential("auth-token"); v != "" || ok || err != nil {
		t.Errorf("no directory: %q %v %v", v, ok, err)
	}

	t.Setenv("CREDENTIALS_DIRECTORY", dir)
	for _, tc := range []struct {
		name  string
		value string
		ok    bool
		err   error
	}{
		{"auth-token", "s3cret-token", true, nil},
		{"absent", "", false, nil},
		{"big", "", false, ErrCredentialTooLarge},
		{"", "", false, ErrInvalidCredentialName},
		{"..", "", false, ErrInvalidCredentialName},
		{"../auth-token", "", false, ErrInvalidCredentialName},
		{"sub/x", "", false, ErrInvalidCredentialName},
	} {
		v, ok, err := Credential(tc.name)
		if v != tc.value || ok != tc.ok || !errors.Is(err, tc.err) {
			t.Errorf("%q: %q %v %v, want %q %v %v", tc.name, v, ok, err, tc.value, tc.ok, tc.err)
		}
	}
	if _, _, err := Credential("sub"); err == nil {
		t.Error("a directory read as a credential")
	}
}
