// Package daemontest runs a real sidecar daemon for the fault tests, sidecar-bench and
// sidecar-soak: the built binary as a child process (`sidecar serve`) on a loopback port
// of its own, with its own state dir, self-signed TLS, cgroup parent and uid range, so
// that it collides with no other daemon on the machine, and the cleanup that leaves
// nothing of it behind. Its tree and cgroup helpers serve the in-process harness of the
// e2e tests too.
package daemontest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/tls/certgen"
	"github.com/sidecar-sandbox/sidecar/tls/tlsconfig"
)

// Options describe the daemon to run.
type Options struct {
	Bin      string // the built sidecar; a sidecar-init beside it starts lease processes
	Parent   string // its cgroup parent: unique on the machine (the daemon sweeps what it does not know under it)
	StateDir string // "": a fresh directory under /var/tmp named after Parent
	Token    string // the shared token; "": a random one
	UIDFirst int    // its uid range: away from every other daemon's
	UIDLast  int
	Env      []string  // more KEY=VALUE settings; they win over the defaults
	Output   io.Writer // the daemon's stdout and stderr; nil discards them
	// KillWithParent sends the daemon SIGTERM should this process die first.
	KillWithParent bool
}

// Binary is one daemon: prepared by New, started (and restarted) by Start on the same
// state dir and address.
type Binary struct {
	Options
	Addr   string // 127.0.0.1:port, fixed across restarts
	URL    string
	CAFile string
	Client *client.Client // shared-token client

	cmd    *exec.Cmd
	exited chan struct{}
}

// New prepares a daemon without starting it: state dir, certificate, port, client.
func New(o Options) (*Binary, error) {
	if o.Token == "" {
		var rnd [24]byte
		_, _ = rand.Read(rnd[:])
		o.Token = hex.EncodeToString(rnd[:])
	}
	var err error
	if o.StateDir == "" {
		// Under /var/tmp, not /tmp: a lease's private /tmp would hide a work root there.
		o.StateDir, err = os.MkdirTemp("/var/tmp", o.Parent+"-")
	} else {
		err = os.MkdirAll(o.StateDir, 0o700)
	}
	if err != nil {
		return nil, err
	}
	// The hosts `sidecar serve` asks for, so that it keeps this certificate.
	caFile, _, _, err := certgen.EnsureSelfSigned(filepath.Join(o.StateDir, "tls"), []string{"localhost", "127.0.0.1", "::1"})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	b := &Binary{Options: o, Addr: addr, URL: "https://" + addr, CAFile: caFile}
	b.Client, err = client.New(client.Config{URL: b.URL, Token: o.Token, CAFile: caFile})
	return b, err
}

// Start runs `sidecar serve` and waits (at most a minute) until /healthz answers.
func (b *Binary) Start(ctx context.Context) error {
	cmd := exec.Command(b.Bin, "serve")
	cmd.Env = append([]string{
		"PATH=" + os.Getenv("PATH"),
		"SIDECAR_AUTH_TOKEN=" + b.Token,
		"SIDECAR_STATE_DIR=" + b.StateDir,
		"SIDECAR_TLS_SELF_SIGNED=true",
		"SIDECAR_LISTEN_ADDR=" + b.Addr,
		"SIDECAR_CGROUP_PARENT=" + b.Parent,
		fmt.Sprintf("SIDECAR_UID_RANGE=%d-%d", b.UIDFirst, b.UIDLast),
		"SIDECAR_ISOLATION=strict",
		"SCRIPT_ENABLED=false",
	}, b.Env...)
	cmd.Stdout, cmd.Stderr = b.Output, b.Output
	// Its own process group: a signal to this one never reaches it by accident.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if b.KillWithParent {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	b.cmd, b.exited = cmd, make(chan struct{})
	go func(exited chan struct{}) { _ = cmd.Wait(); close(exited) }(b.exited)
	hc := HTTPClient(b.CAFile, 2*time.Second)
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-b.exited:
			return fmt.Errorf("sidecar serve exited at start: %v", cmd.ProcessState)
		case <-ctx.Done():
			b.Kill()
			return ctx.Err()
		default:
		}
		if resp, err := hc.Get(b.URL + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			b.Kill()
			return errors.New("sidecar serve did not answer /healthz within a minute")
		}
		time.Sleep(50 * time.Millisecond) // poll interval, not a wait for a state
	}
}

// Running reports whether the daemon is started and has not exited.
func (b *Binary) Running() bool {
	if b.cmd == nil {
		return false
	}
	select {
	case <-b.exited:
		return false
	default:
		return true
	}
}

// Pid is the daemon's process id (0 before Start).
func (b *Binary) Pid() int {
	if b.cmd == nil {
		return 0
	}
	return b.cmd.Process.Pid
}

// ExitCode is the exit status of a daemon that has exited, -1 otherwise.
func (b *Binary) ExitCode() int {
	if b.Running() || b.cmd == nil {
		return -1
	}
	return b.cmd.ProcessState.ExitCode()
}

// Kill sends SIGKILL to the daemon (its pid only: lease processes live in their own
// sessions and cgroups) and reaps it.
func (b *Binary) Kill() {
	if b.Running() {
		_ = syscall.Kill(b.Pid(), syscall.SIGKILL)
		<-b.exited
	}
}

// Stop asks the daemon to shut down (SIGTERM) and waits for it, killing it after 30 s;
// the error says it had to.
func (b *Binary) Stop() error {
	if !b.Running() {
		return nil
	}
	// A kept-alive HTTP/2 connection would hold the daemon's graceful shutdown for a
	// second, waiting for this client to hang up after its GOAWAY.
	b.Client.CloseIdleConnections()
	_ = syscall.Kill(b.Pid(), syscall.SIGTERM)
	select {
	case <-b.exited:
		return nil
	case <-time.After(30 * time.Second):
		b.Kill()
		return errors.New("sidecar serve ignored SIGTERM for 30s and was killed")
	}
}

// Close releases every lease through the API (leases survive a daemon's stop by design,
// and their cgroups would outlive it), stops the daemon, removes its empty cgroup parent
// and, when New made it, its state dir. Errors say what was left.
func (b *Binary) Close(removeState bool) error {
	var errs []error
	if b.Running() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		errs = append(errs, b.ReleaseAll(ctx))
		cancel()
		errs = append(errs, b.Stop())
	}
	errs = append(errs, RemoveCgroupParent(b.Parent))
	if removeState {
		errs = append(errs, RemoveTree(b.StateDir))
	}
	return errors.Join(errs...)
}

// ReleaseAll releases every lease the daemon holds.
func (b *Binary) ReleaseAll(ctx context.Context) error {
	leases, err := b.Client.List(ctx)
	if err != nil {
		return fmt.Errorf("list leases: %w", err)
	}
	var errs []error
	for _, l := range leases {
		if err := b.Client.Release(ctx, l.ID); err != nil {
			errs = append(errs, fmt.Errorf("release %s: %w", l.ID, err))
		}
	}
	return errors.Join(errs...)
}

// HTTPClient trusts caFile (the system roots when it is "").
func HTTPClient(caFile string, timeout time.Duration) *http.Client {
	cfg, err := tlsconfig.Client(caFile, "", "")
	if err != nil {
		cfg = nil // an unreadable CA fails every request, which says so
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: cfg}}
}

// CgroupParents lists parent's directories in every cgroup hierarchy: on v1 one per
// hierarchy; on v2 at the root, or under the cgroup systemd delegated to the unit the
// daemon ran in (<slice>/<unit>/<parent>, internal/confine). Symlinked hierarchies
// (cpu -> cpu,cpuacct) count once.
func CgroupParents(parent string) []string {
	var ps []string
	for _, pattern := range []string{"/sys/fs/cgroup/", "/sys/fs/cgroup/*/", "/sys/fs/cgroup/*/*/"} {
		matches, _ := filepath.Glob(pattern + parent)
		for _, m := range matches {
			real, err := filepath.EvalSymlinks(m)
			if fi, serr := os.Stat(real); err != nil || serr != nil || !fi.IsDir() || slices.Contains(ps, real) {
				continue
			}
			ps = append(ps, real)
		}
	}
	return ps
}

// LeaseCgroups lists the directories of a lease's cgroup under parent, in every hierarchy.
func LeaseCgroups(parent, lease string) []string {
	var dirs []string
	for _, p := range CgroupParents(parent) {
		if fi, err := os.Stat(filepath.Join(p, lease)); err == nil && fi.IsDir() {
			dirs = append(dirs, filepath.Join(p, lease))
		}
	}
	return dirs
}

// RemoveCgroupParent removes parent in every hierarchy: a daemon leaves it behind when
// it exits. rmdir removes only an empty cgroup, so nothing alive is touched.
func RemoveCgroupParent(parent string) error {
	var errs []error
	for _, p := range CgroupParents(parent) {
		if err := syscall.Rmdir(p); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("cgroup %s left: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// MountsUnder lists the mount points at or below dir, innermost first.
func MountsUnder(dir string) []string {
	info, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return []string{"(mountinfo unreadable: " + err.Error() + ")"}
	}
	var found []string
	for line := range strings.SplitSeq(string(info), "\n") {
		if m := strings.Fields(line); len(m) > 4 && (m[4] == dir || strings.HasPrefix(m[4], dir+"/")) {
			found = append(found, m[4])
		}
	}
	slices.Reverse(found)
	return found
}

// RemoveTree removes dir unless something is still mounted at or below it: removing
// through a mount would delete what the mount shows (once a host's /etc).
func RemoveTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if m := MountsUnder(abs); len(m) > 0 {
		return fmt.Errorf("not removing %s: still mounted: %s", abs, strings.Join(m, ", "))
	}
	return os.RemoveAll(abs)
}

// ProcStatus is what /proc says of a process: peak and current resident memory and the
// CPU time it used so far.
type ProcStatus struct {
	HWMKB, RSSKB int64
	CPU          time.Duration
	Err          error
}

// ReadProcStatus reads pid's ProcStatus.
func ReadProcStatus(pid int) ProcStatus {
	var ps ProcStatus
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for line := range strings.SplitSeq(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmHWM":
			ps.HWMKB = n
		case "VmRSS":
			ps.RSSKB = n
		}
	}
	stat, err2 := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	// Fields after the command (which may hold spaces) start at state, field 3.
	f := strings.Fields(string(stat)[strings.LastIndexByte(string(stat), ')')+1:])
	if ps.Err = errors.Join(err, err2); ps.Err == nil && len(f) < 13 {
		ps.Err = errors.New("short /proc stat")
	}
	if ps.Err == nil {
		ut, _ := strconv.ParseInt(f[11], 10, 64)          // utime, field 14
		st, _ := strconv.ParseInt(f[12], 10, 64)          // stime, field 15
		ps.CPU = time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on every Linux this runs on
	}
	return ps
}

func (p ProcStatus) String() string {
	if p.Err != nil {
		return "unknown (" + p.Err.Error() + ")"
	}
	return fmt.Sprintf("VmHWM %.0f MB, VmRSS %.0f MB, CPU %.1f s", float64(p.HWMKB)/1e3*1.024, float64(p.RSSKB)/1e3*1.024, p.CPU.Seconds())
}
