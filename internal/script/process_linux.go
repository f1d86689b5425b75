package script

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	// workerOverhead is what a worker needs besides the script's heap: Go runtime, the
	// compiled QuickJS module and wazero's bookkeeping (~25 MiB measured, doubled).
	workerOverhead = 64 << 20
	// heapFactor covers wazero growing linear memory by copying (old and new at once).
	heapFactor = 3
	// rlimitSlack is added to RLIMIT_DATA: Go and wazero reserve data mappings they
	// never touch (~130 MiB measured).
	rlimitSlack   = 256 << 20
	readyTimeout  = 60 * time.Second
	watchInterval = 10 * time.Millisecond
	stderrTail    = 4 << 10
)

// workerBudget is the memory a worker may use while running a script of memBytes.
func workerBudget(memBytes int64) int64 { return workerOverhead + heapFactor*memBytes }

// proc is one live worker process.
type proc struct {
	id     int64
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	cgroup string // its child cgroup of Runner.cell; "": RLIMIT_DATA is the bound
	limit  int64  // memory limit last written to its cgroup (only the job's caller touches it)
	// lastOOMKills is its cgroup's OOM kill count read just before the cgroup was removed:
	// its slot removes it as soon as the worker exits, maybe before the job's caller asks.
	lastOOMKills atomic.Int64
	stderr       *tailBuffer
	exited       chan struct{} // closed once the process has been reaped
	landlock     int           // Landlock ABI the worker confined itself with, 0 none
	idleSince    time.Time     // when it last became idle; the queue's lock guards it
	once         sync.Once
}

// spawnWorker starts a worker, confines it and waits until its runtime is warm.
func (r *Runner) spawnWorker(ctx context.Context, id int64) (*proc, error) {
	cmd := exec.Command(r.cfg.HelperPath, r.cfg.WorkerArgs...)
	cmd.Env = []string{} // not nil: nil would inherit the daemon's environment
	cmd.Dir = r.root
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if r.asRoot {
		attr.Credential = &syscall.Credential{Uid: uint32(r.cfg.WorkerUID), Gid: uint32(r.cfg.WorkerGID), Groups: []uint32{}}
	}
	cmd.SysProcAttr = attr
	p := &proc{id: id, cmd: cmd, stderr: &tailBuffer{max: stderrTail}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p.in, p.out = in, bufio.NewReader(out)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	// The worker does nothing before it reads its setup frame, so confining it here
	// still comes before any script or runtime code runs.
	if err := r.confine(p); err != nil {
		r.release(p)
		return nil, err
	}
	s := setup{
		Root: r.root, CacheDir: r.cacheDir, MemoryBytes: r.cfg.DefaultMemoryBytes,
		MaxResultBytes: r.cfg.MaxResultBytes, MaxLogBytes: r.cfg.MaxLogBytes, MaxLogLines: r.cfg.MaxLogLines,
		GoMemoryLimit: workerBudget(r.cfg.MaxMemoryBytes),
		Seccomp:       r.cfg.Seccomp != "off",
	}
	if p.cgroup == "" {
		s.DataLimit = workerBudget(r.cfg.MaxMemoryBytes) + rlimitSlack
	}
	ready := make(chan error, 1)
	go func() {
		if err := writeFrame(p.in, s); err != nil {
			ready <- err
			return
		}
		var rep reply
		err := readFrame(p.out, 1<<16, &rep)
		if err == nil && !rep.Ready {
			err = errors.New("worker did not say ready")
		}
		p.landlock = rep.Landlock
		ready <- err
	}()
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case err = <-ready:
	case <-timer.C:
		err = errors.New("timed out")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		r.release(p)
		return nil, fmt.Errorf("worker %d not ready: %w (stderr: %q)", id, err, p.stderr.String())
	}
	return p, nil
}

// confine puts the worker into its memory cgroup. Without one, setup.DataLimit bounds
// the worker's data segment instead: the worker sets it on itself, because prlimit on
// another process needs CAP_SYS_RESOURCE, which containers often drop.
func (r *Runner) confine(p *proc) error {
	if r.cell == nil {
		return nil // the worker lowers its own RLIMIT_DATA (setup.DataLimit) before any script
	}
	name, limit := "w"+strconv.FormatInt(p.id, 10), workerBudget(r.cfg.MaxMemoryBytes)
	if err := r.cell.NewChild(name, limit); err != nil {
		return fmt.Errorf("worker cgroup: %w", err)
	}
	p.cgroup, p.limit = name, limit
	if err := r.cell.Join(name, p.cmd.Process.Pid); err != nil {
		return fmt.Errorf("worker cgroup: %w", err)
	}
	return nil
}

// kill ends the worker (and anything in its process group) and reaps it.
func (p *proc) kill() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		_ = p.cmd.Process.Kill()
		_ = p.in.Close()
	})
	<-p.exited
}

// rss is the worker's resident memory in bytes (0 when it cannot be read).
func (p *proc) rss() int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(string(f[1]), 10, 64)
	return pages * int64(os.Getpagesize())
}

// tailBuffer keeps the last max bytes written (a worker's stderr, for diagnostics).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
