package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sidecar-sandbox/sidecar/client"
	"github.com/sidecar-sandbox/sidecar/tls/tlsconfig"
)

// daemon is the sidecar daemon this run started.
type daemon struct {
	cmd      *exec.Cmd
	exited   chan struct{}
	url      string
	caFile   string
	token    string
	stateDir string
	logPath  string
	cgroup   string // SIDECAR_CGROUP_PARENT, unique to this run
}

// startDaemon runs bin serve with strict isolation, self-signed TLS on a loopback port the
// kernel picks, a fresh token and state dir under dir, room for maxLeases leases with
// small default limits, and its own cgroup parent and uid range so it cannot collide with
// another daemon on the machine. It returns once the daemon printed its URL.
func startDaemon(ctx context.Context, log *slog.Logger, bin, dir string, maxLeases int) (*daemon, error) {
	abs, err := filepath.Abs(bin)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(abs), "sidecar-init")); err != nil {
		return nil, fmt.Errorf("sidecar-init must sit next to %s (run make build): %w", abs, err)
	}
	tok := make([]byte, 32)
	_, _ = rand.Read(tok)
	d := &daemon{token: base64.RawURLEncoding.EncodeToString(tok), stateDir: filepath.Join(dir, "state"),
		logPath: filepath.Join(dir, "daemon.log"), exited: make(chan struct{})}
	if err := os.Mkdir(d.stateDir, 0o700); err != nil {
		return nil, err
	}
	logFile, err := os.Create(d.logPath)
	if err != nil {
		return nil, err
	}
	tag := fmt.Sprintf("sidecar-bench-%d", os.Getpid())
	d.cgroup = tag
	// A uid block of its own, away from the default range other daemons use.
	uidFirst := 400000 + (os.Getpid()%50)*1000
	d.cmd = exec.Command(abs, "serve")
	d.cmd.Env = append(os.Environ(),
		"SIDECAR_AUTH_TOKEN="+d.token,
		"SIDECAR_LISTEN_ADDR=127.0.0.1:0",
		"SIDECAR_STATE_DIR="+d.stateDir,
		"SIDECAR_WORK_ROOT="+filepath.Join(dir, "leases"),
		"SIDECAR_TLS_SELF_SIGNED=true",
		"SIDECAR_ISOLATION=strict",
		"SIDECAR_MAX_LEASES="+strconv.Itoa(max(maxLeases+16, 64)),
		"SIDECAR_DEFAULT_LIMITS_MEMORY_BYTES="+strconv.Itoa(64<<20),
		"SIDECAR_DEFAULT_LIMITS_PIDS=64",
		"SIDECAR_CGROUP_PARENT="+tag,
		fmt.Sprintf("SIDECAR_UID_RANGE=%d-%d", uidFirst, uidFirst+999),
		"SIDECAR_LOG_LEVEL=warn",
	)
	pr, pw := io.Pipe()
	d.cmd.Stdout = logFile
	d.cmd.Stderr = pw
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	urlc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logFile, line)
			if u, ok := strings.CutPrefix(line, "export SANDBOX_REMOTE_URL="); ok {
				select {
				case urlc <- u:
				default:
				}
			}
		}
		_, _ = io.Copy(logFile, pr)
	}()
	go func() {
		_ = d.cmd.Wait()
		pw.Close()
		close(d.exited)
	}()
	select {
	case d.url = <-urlc:
	case <-d.exited:
		return nil, fmt.Errorf("the daemon exited at start (%v); its log: %s", d.cmd.ProcessState, tail(d.logPath))
	case <-time.After(30 * time.Second):
		d.stop(log)
		return nil, fmt.Errorf("the daemon printed no URL within 30s; its log: %s", tail(d.logPath))
	case <-ctx.Done():
		d.stop(log)
		return nil, ctx.Err()
	}
	d.caFile = filepath.Join(d.stateDir, "tls", "tls-self-signed.crt")
	log.Info("daemon up", "pid", d.cmd.Process.Pid, "url", d.url, "log", d.logPath)
	return d, nil
}

// client is a shared-token client of the daemon. http1 forces HTTP/1.1 where the client
// would negotiate HTTP/2, to tell the protocol's cost from the daemon's.
func (d *daemon) client(http1 bool) (*client.Client, error) {
	cfg := client.Config{URL: d.url, Token: d.token, CAFile: d.caFile}
	if http1 {
		tlsConf, err := tlsconfig.Client(d.caFile, "", "")
		if err != nil {
			return nil, err
		}
		tlsConf.NextProtos = []string{"http/1.1"}
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = tlsConf
		t.ForceAttemptHTTP2 = false
		t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{} // no h2
		t.MaxIdleConnsPerHost = 16
		t.WriteBufferSize, t.ReadBufferSize = 256<<10, 256<<10
		cfg.HTTPClient = &http.Client{Transport: t}
	}
	return client.New(cfg)
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// stop asks the daemon to shut down (SIGTERM: it releases its leases) and kills it if it
// has not exited within 30 seconds.
func (d *daemon) stop(log *slog.Logger) {
	defer d.removeCgroups(log)
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		log.Warn("daemon ignored SIGTERM for 30s; killing it", "pid", d.pid())
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// removeCgroups removes the daemon's parent cgroup in every hierarchy: the daemon leaves
// it behind when it exits. rmdir removes only an empty cgroup, so nothing alive is touched.
func (d *daemon) removeCgroups(log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", d.cgroup))
	if two := filepath.Join("/sys/fs/cgroup", d.cgroup); fileExists(two) {
		dirs = append(dirs, two)
	}
	for _, dir := range dirs {
		if err := syscall.Rmdir(dir); err != nil {
			log.Warn("cgroup left behind", "dir", dir, "err", err)
		}
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// status reads the daemon's memory and CPU from /proc.
func (d *daemon) status() procStatus { return readProcStatus(d.pid()) }

// procStatus is what /proc says of a process: peak and current resident memory and the
// CPU time it used so far.
type procStatus struct {
	hwmKB, rssKB int64
	cpu          time.Duration
	err          error
}

// clockTick is USER_HZ, 100 on every Linux this runs on.
const clockTick = 100

func readProcStatus(pid int) procStatus {
	var ps procStatus
	ps.hwmKB, _ = strconv.ParseInt(strings.TrimSuffix(firstField(fmt.Sprintf("/proc/%d/status", pid), "VmHWM"), " kB"), 10, 64)
	ps.rssKB, _ = strconv.ParseInt(strings.TrimSuffix(firstField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS"), " kB"), 10, 64)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		ps.err = err
		return ps
	}
	// Fields after the command (which may hold spaces) start at state, field 3.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b)[i+1:])
	if len(f) < 13 {
		ps.err = errors.New("short /proc stat")
		return ps
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // utime, field 14
	st, _ := strconv.ParseInt(f[12], 10, 64) // stime, field 15
	ps.cpu = time.Duration(ut+st) * time.Second / clockTick
	return ps
}

func (p procStatus) String() string {
	if p.err != nil {
		return "unknown (" + p.err.Error() + ")"
	}
	return fmt.Sprintf("VmHWM %.0f MB, VmRSS %.0f MB, CPU %.1f s", float64(p.hwmKB)/1e3*1.024, float64(p.rssKB)/1e3*1.024, p.cpu.Seconds())
}

// tail is the end of a log file, for an error message.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}
