package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func start(t *testing.T, m *Manager, r StartRequest) *Process {
	t.Helper()
	p, created, err := m.Start(t.Context(), "lease", r)
	if err != nil {
		t.Fatal(err)
	}
	if !created {
		t.Fatal("created = false for a new process")
	}
	return p
}

// A dropped subscriber that resumes with since = the offset it got to sees exactly the
// output, even when it drops in the middle of a chunk.
func TestResumeIsExact(t *testing.T) {
	m := newManager(t, Config{BufferBytes: 4 << 20})
	const n = 200000
	want := seqOutput(n)
	p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"seq", "1", strconv.Itoa(n)}}})
	rng := rand.New(rand.NewPCG(1, 2))
	var got bytes.Buffer
	var since int64
	resumes := 0
	for {
		s, err := p.Subscribe(since)
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.Next(t.Context())
		if errors.Is(err, io.EOF) {
			s.Close()
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Data) == 0 {
			t.Fatalf("empty chunk at %d", c.Offset)
		}
		if c.Offset != since {
			t.Fatalf("chunk at %d, resumed at %d", c.Offset, since)
		}
		// Keep a random prefix, as if the connection dropped mid-message.
		keep := rng.IntN(len(c.Data) + 1)
		got.Write(c.Data[:keep])
		since += int64(keep)
		if s.Lost() != 0 {
			t.Fatalf("lost %d with a buffer larger than the output", s.Lost())
		}
		s.Close()
		resumes++
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("resumed output differs: %d bytes, want %d", got.Len(), len(want))
	}
	if st := p.Status(); st.State != apitype.ProcessExited || *st.ExitCode != 0 || st.OutputOffset != int64(len(want)) || st.OutputStart != 0 {
		t.Fatalf("status %+v", st)
	}
	t.Logf("%d resumes", resumes)
}

// A subscriber that reads nothing while the process writes loses the oldest bytes
// (counted) while one that keeps up gets everything, and the process is never blocked.
func TestSlowSubscriberLosesFastGetsAll(t *testing.T) {
	const buffer = MinBufferBytes
	m := newManager(t, Config{BufferBytes: buffer})
	p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"cat"}}, Stdin: true})
	slow, err := p.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	fast, err := p.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}

	// 4 MiB of a pattern that is different at every offset in any window we check.
	const total = 4 << 20
	want := make([]byte, total)
	for i := range want {
		want[i] = byte(i*7 + i>>8)
	}
	progress := make(chan int64, 1024)
	var fastGot bytes.Buffer
	fastErr := make(chan error, 1)
	go func() {
		for {
			c, err := fast.Next(context.Background())
			if err != nil {
				close(progress)
				fastErr <- err
				return
			}
			fastGot.Write(c.Data)
			progress <- c.Offset + int64(len(c.Data))
		}
	}()
	var fastAt int64
	for off := 0; off < total; off += 16 << 10 {
		if _, err := p.WriteStdin(want[off : off+16<<10]); err != nil {
			t.Fatal(err)
		}
		// The fast reader keeps up: the next block is written only once it has this one.
		for fastAt < int64(off+16<<10) {
			fastAt = <-progress
		}
	}
	if err := p.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	waitDone(t, p) // the slow subscriber has read nothing: the process was not blocked
	if err := <-fastErr; !errors.Is(err, io.EOF) {
		t.Fatalf("fast subscriber: %v", err)
	}
	if !bytes.Equal(fastGot.Bytes(), want) || fast.Lost() != 0 {
		t.Fatalf("fast subscriber got %d bytes (lost %d), want all %d", fastGot.Len(), fast.Lost(), total)
	}

	var received int64
	for {
		c, err := slow.Next(t.Context())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(c.Data, want[c.Offset:c.Offset+int64(len(c.Data))]) {
			t.Fatalf("slow subscriber: wrong bytes at %d", c.Offset)
		}
		received += int64(len(c.Data))
	}
	if slow.Lost() == 0 || received+slow.Lost() != total || received > buffer {
		t.Fatalf("slow subscriber: received %d lost %d, total %d, buffer %d", received, slow.Lost(), total, buffer)
	}
}

// The replay buffer stays within BufferBytes however much (and however finely) a
// process writes, and memory stays flat.
func TestRingBound(t *testing.T) {
	const buffer = MinBufferBytes
	m := newManager(t, Config{BufferBytes: buffer})
	for _, tc := range []struct {
		name   string
		script string
		total  int64
	}{
		{"large reads", "head -c 67108864 /dev/zero", 64 << 20},
		{"tiny interleaved writes", "i=0; while [ $i -lt 5000 ]; do echo a; echo b >&2; i=$((i+1)); done", 20000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			p := start(t, m, StartRequest{Spec: sh(tc.script)})
			waitDone(t, p)
			runtime.GC()
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			l := p.log
			l.mu.Lock()
			used, start, end := l.used, l.start, l.end
			l.mu.Unlock()
			if end != tc.total || used > buffer || end-start > buffer {
				t.Fatalf("end %d (want %d), used %d, kept %d, bound %d", end, tc.total, used, end-start, buffer)
			}
			if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 4<<20 {
				t.Fatalf("heap grew by %d bytes for a %d-byte buffer", grew, buffer)
			}
			runtime.KeepAlive(p)
		})
	}
}

func TestSubscribeOffsets(t *testing.T) {
	m := newManager(t, Config{BufferBytes: MinBufferBytes})
	p := start(t, m, StartRequest{Spec: sh("head -c 1048576 /dev/zero")})
	waitDone(t, p)
	st := p.Status()
	if st.OutputOffset != 1<<20 || st.OutputStart == 0 {
		t.Fatalf("status %+v", st)
	}
	for _, since := range []int64{-2, st.OutputOffset + 1} {
		if _, err := p.Subscribe(since); !errors.Is(err, ErrInvalid) {
			t.Fatalf("since %d: %v", since, err)
		}
	}
	s, err := p.Subscribe(10)
	if err != nil {
		t.Fatal(err)
	}
	if s.Lost() != st.OutputStart-10 || s.Offset() != st.OutputStart {
		t.Fatalf("lost %d offset %d, start %d", s.Lost(), s.Offset(), st.OutputStart)
	}
	if got := int64(len(readAll(t, s))); got != st.OutputOffset-st.OutputStart {
		t.Fatalf("replayed %d bytes", got)
	}
	live, err := p.Subscribe(-1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := live.Next(t.Context()); !errors.Is(err, io.EOF) {
		t.Fatalf("live subscription of an ended process: %v", err)
	}
}

func TestSubscriptionCloseAndContext(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"sleep", "1000"}}})
	s, err := p.Subscribe(-1)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	errc := make(chan error, 1)
	go func() { _, err := s.Next(context.Background()); errc <- err }()
	s.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("closed: %v", err)
	}
}

func TestBackgroundExitAndSignals(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"sleep", "1000"}}})
	if got := m.Running("lease"); got != 1 {
		t.Fatalf("Running = %d", got)
	}
	for _, bad := range []string{"", "FOO", "SIG", "9", "SIGTERMX"} {
		if err := m.Signal("lease", p.ID(), bad); !errors.Is(err, ErrInvalid) {
			t.Fatalf("signal %q: %v", bad, err)
		}
	}
	if err := m.Signal("lease", "nope", "TERM"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown pid: %v", err)
	}
	if err := m.Signal("other", p.ID(), "TERM"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("other lease: %v", err)
	}
	if err := m.Signal("lease", p.ID(), "sigterm"); err != nil {
		t.Fatal(err)
	}
	waitDone(t, p)
	st := p.Status()
	if st.State != apitype.ProcessExited || st.Signal != "TERM" || *st.ExitCode != 143 || st.EndedAt == nil || st.TimedOut {
		t.Fatalf("status %+v", st)
	}
	if err := m.Signal("lease", p.ID(), "KILL"); !errors.Is(err, ErrExited) {
		t.Fatalf("signal after exit: %v", err)
	}
	if got := m.Running("lease"); got != 0 {
		t.Fatalf("Running = %d after exit", got)
	}

	k := start(t, m, StartRequest{Spec: sh("sleep 1000 & wait")})
	if err := m.Kill("lease", k.ID()); err != nil {
		t.Fatal(err)
	}
	waitDone(t, k)
	if st := k.Status(); st.Signal != "KILL" || st.TimedOut {
		t.Fatalf("killed status %+v", st)
	}
	if err := m.Kill("lease", k.ID()); !errors.Is(err, ErrExited) {
		t.Fatalf("kill after exit: %v", err)
	}

	q := start(t, m, StartRequest{Spec: sh("exit 7")})
	waitDone(t, q)
	if st := q.Status(); *st.ExitCode != 7 || st.Signal != "" {
		t.Fatalf("status %+v", st)
	}
}

func TestParseSignal(t *testing.T) {
	for name, want := range map[string]string{
		"TERM": "TERM", "SIGTERM": "TERM", "term": "TERM", "Kill": "KILL", "int": "INT", "HUP": "HUP",
		"QUIT": "QUIT", "usr1": "USR1", "SIGUSR2": "USR2", "STOP": "STOP", "cont": "CONT", "WINCH": "WINCH",
	} {
		sig, err := ParseSignal(name)
		if err != nil || SignalName(sig) != want {
			t.Errorf("ParseSignal(%q) = %v (%s), %v", name, sig, SignalName(sig), err)
		}
	}
}

func TestBackgroundTimeouts(t *testing.T) {
	m := newManager(t, Config{})
	for _, tc := range []struct {
		name string
		r    StartRequest
	}{
		{"hard", StartRequest{Spec: sh("echo hi; sleep 1000 & wait"), Timeout: time.Second}},
		{"idle", StartRequest{Spec: sh("echo hi; sleep 1000 & wait"), IdleTimeout: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := start(t, m, tc.r)
			waitDone(t, p)
			st := p.Status()
			if !st.TimedOut || st.Signal != "KILL" || st.OutputOffset != 3 {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

// A background process's exit is its main process's exit, even when a grandchild holds
// the output pipe. The grandchild is a leftover and stays; with KillLeftovers it is
// killed with the tree, as is what it left in the pipe read.
func TestGrandchildHoldingPipeDoesNotHang(t *testing.T) {
	m := newManager(t, Config{})
	for _, kill := range []bool{false, true} {
		p := start(t, m, StartRequest{Spec: sh("sleep 1000 & echo $!"), KillLeftovers: kill})
		s, err := p.Subscribe(0)
		if err != nil {
			t.Fatal(err)
		}
		waitDone(t, p)
		out := readAll(t, s)
		pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatalf("output %q", out)
		}
		if pidAlive(pid) == kill {
			t.Fatalf("kill_leftovers %v: grandchild %d alive: %v", kill, pid, pidAlive(pid))
		}
		if st := p.Status(); *st.ExitCode != 0 {
			t.Fatalf("status %+v", st)
		}
	}
}

// A leftover holding stdout does not hold an Exec's reply back (outputGrace bounds the
// wait), and what it writes afterwards is drained: it neither blocks on a full pipe nor
// dies of EPIPE.
func TestLeftoverHoldingStdoutDoesNotHoldReply(t *testing.T) {
	ex := newTestExecer(t)
	m := newManager(t, Config{Execer: ex})
	res, err := m.Exec(t.Context(), "lease", ExecRequest{
		Spec: sh(`(while :; do head -c 4096 /dev/zero; echo tick >> ticks; sleep 0.01; done) & echo $!`),
	})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(res.Stdout, "\n", 2)[0]))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
	ticks := func() int { b, _ := os.ReadFile(filepath.Join(ex.dir, "ticks")); return bytes.Count(b, []byte("\n")) }
	// 64 KiB and more written after the reply: a pipe nobody read would be full by now.
	after := ticks() + 20
	waitFor(t, "the leftover writing on after the reply", func() bool { return ticks() >= after || !pidAlive(pid) })
	if !pidAlive(pid) {
		t.Fatalf("leftover %d died after the reply", pid)
	}
}

// A leftover that writes as fast as it can to a pipe nobody keeps is read at leftoverPace:
// it writes at most what the pace lets through (it waits on its full pipe meanwhile),
// instead of the daemon copying gigabytes a second to nowhere on a core of its own.
func TestLeftoverOutputReadAtAPace(t *testing.T) {
	m := newManager(t, Config{})
	res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh(`cat /dev/zero & echo $!`)})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(res.Stdout, "\n", 2)[0]))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("result %+v", res)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	written := func() int64 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
		if err != nil {
			t.Fatalf("the leftover's I/O counters: %v", err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "wchar: "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		t.Fatalf("no wchar in %q", b)
		return 0
	}
	var cpu0, cpu1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &cpu0)
	before, start := written(), time.Now()
	time.Sleep(time.Second)
	after, elapsed := written(), time.Since(start)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &cpu1)
	reads := int64(elapsed/leftoverPace) + 1
	limit := reads*readSize + pipeSize // each paced read frees at most readSize; the pipe held some already
	cpu := time.Duration(cpu1.Utime.Nano() + cpu1.Stime.Nano() - cpu0.Utime.Nano() - cpu0.Stime.Nano())
	t.Logf("the leftover wrote %d bytes in %v; this process used %v of CPU meanwhile", after-before, elapsed, cpu)
	if !pidAlive(pid) {
		t.Fatalf("leftover %d died: it must wait on its pipe, not get EPIPE", pid)
	}
	if after-before > limit {
		t.Fatalf("the leftover wrote %d bytes in %v, more than %d paced reads drain (%d)", after-before, elapsed, reads, limit)
	}
	if after == before {
		t.Fatalf("the leftover wrote nothing in %v: its pipe is no longer read", elapsed)
	}
}

// Even a holder of the pipe that escaped the tree (here: setsid, which the test
// Execer's process-group Tree cannot see) does not keep the process from ending.
func TestEscapedPipeHolderDoesNotHang(t *testing.T) {
	m := newManager(t, Config{})
	res, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("setsid sleep 1000 & echo $!")})
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if err != nil {
		t.Fatalf("output %q", res.Stdout)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if res.ExitCode != 0 || !pidAlive(pid) {
		t.Fatalf("result %+v; escaped sleep alive: %v", res, pidAlive(pid))
	}
}

// A client's end of input that comes after the process ended (its stdin pipe closed with
// the run) is a no-op, as a second CloseStdin is, not an error that would break its stream.
func TestCloseStdinAfterTheEnd(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, StartRequest{Spec: sh("exit 5"), Stdin: true})
	<-p.Done()
	if err := p.CloseStdin(); err != nil {
		t.Fatalf("CloseStdin after the end: %v", err)
	}
	if _, err := p.WriteStdin([]byte("late")); !errors.Is(err, ErrStdinClosed) {
		t.Fatalf("WriteStdin after the end: %v, want ErrStdinClosed", err)
	}
}

func TestBackgroundStdin(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"cat"}}, Stdin: true})
	s, err := p.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteStdin([]byte("one\ntwo")); err != nil {
		t.Fatal(err)
	}
	if err := p.CloseStdin(); err != nil {
		t.Fatal(err)
	}
	if err := p.CloseStdin(); err != nil {
		t.Fatalf("second CloseStdin: %v", err)
	}
	if _, err := p.WriteStdin([]byte("x")); !errors.Is(err, ErrStdinClosed) {
		t.Fatalf("write after close: %v", err)
	}
	if out := readAll(t, s); string(out) != "one\ntwo" {
		t.Fatalf("output %q", out)
	}

	q := start(t, m, StartRequest{Spec: Spec{Argv: []string{"cat"}}})
	if _, err := q.WriteStdin([]byte("x")); !errors.Is(err, ErrStdinClosed) {
		t.Fatalf("write without stdin: %v", err)
	}
	waitDone(t, q) // empty stdin: cat ends at once
}

func TestStartIsIdempotent(t *testing.T) {
	m := newManager(t, Config{})
	const callers = 16
	var wg sync.WaitGroup
	procs := make([]*Process, callers)
	created := make([]bool, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() {
			procs[i], created[i], errs[i] = m.Start(t.Context(), "lease", StartRequest{ID: "dev-server.1", Spec: Spec{Argv: []string{"sleep", "1000"}}})
		})
	}
	wg.Wait()
	n := 0
	for i := range callers {
		if errs[i] != nil || procs[i] != procs[0] {
			t.Fatalf("caller %d: %v, %p vs %p", i, errs[i], procs[i], procs[0])
		}
		if created[i] {
			n++
		}
	}
	if n != 1 || procs[0].ID() != "dev-server.1" || m.Running("lease") != 1 {
		t.Fatalf("%d creators, id %q, running %d", n, procs[0].ID(), m.Running("lease"))
	}
	// The same id in another lease is another process.
	other, created2, err := m.Start(t.Context(), "lease2", StartRequest{ID: "dev-server.1", Spec: Spec{Argv: []string{"true"}}})
	if err != nil || !created2 || other == procs[0] {
		t.Fatalf("other lease: %v %v", created2, err)
	}
	t.Cleanup(func() { m.ReleaseLease("lease2") })
	// A failed start leaves nothing behind, so the id can be used again.
	if _, _, err := m.Start(t.Context(), "lease", StartRequest{ID: "x", Spec: Spec{Argv: []string{"no-such-command-xyz"}}}); !errors.Is(err, ErrStart) {
		t.Fatalf("bad start: %v", err)
	}
	if _, err := m.Get("lease", "x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("failed start is visible: %v", err)
	}
	if _, created, err := m.Start(t.Context(), "lease", StartRequest{ID: "x", Spec: Spec{Argv: []string{"true"}}}); err != nil || !created {
		t.Fatalf("retry: %v %v", created, err)
	}
}

func TestStartValidation(t *testing.T) {
	m := newManager(t, Config{MaxProcesses: 2})
	for _, tc := range []struct {
		name string
		r    StartRequest
	}{
		{"id with slash", StartRequest{ID: "a/b", Spec: sh("true")}},
		{"id too long", StartRequest{ID: strings.Repeat("a", 65), Spec: sh("true")}},
		{"id with space", StartRequest{ID: "a b", Spec: sh("true")}},
		{"rows too large without a TTY", StartRequest{Spec: sh("true"), Rows: 1001}},
		{"timeout over the bound", StartRequest{Spec: sh("true"), Timeout: MaxTimeout + time.Second}},
		{"rows too large", StartRequest{Spec: Spec{Argv: []string{"true"}, TTY: true}, Rows: 1001}},
		{"cols too large", StartRequest{Spec: Spec{Argv: []string{"true"}, TTY: true}, Cols: 5000}},
		{"negative idle", StartRequest{Spec: sh("true"), IdleTimeout: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := m.Start(t.Context(), "lease", tc.r); !errors.Is(err, ErrInvalid) {
				t.Fatalf("err %v", err)
			}
		})
	}
	start(t, m, StartRequest{Spec: Spec{Argv: []string{"sleep", "1000"}}})
	start(t, m, StartRequest{Spec: Spec{Argv: []string{"sleep", "1000"}}})
	if _, _, err := m.Start(t.Context(), "lease", StartRequest{Spec: sh("true")}); !errors.Is(err, ErrLimit) {
		t.Fatalf("over the limit: %v", err)
	}
	if len(m.List("lease")) != 2 {
		t.Fatalf("list %d", len(m.List("lease")))
	}
}

func TestListAndForgetOldestExited(t *testing.T) {
	m := newManager(t, Config{MaxExited: 3})
	var ids []string
	for i := range 5 {
		p := start(t, m, StartRequest{ID: fmt.Sprintf("job%d", i), Spec: sh("true")})
		waitDone(t, p)
		ids = append(ids, p.ID())
	}
	// Forgetting runs right after Done closes; wait for it.
	waitFor(t, "old processes forgotten", func() bool { return len(m.List("lease")) == 3 })
	var got []string
	for _, p := range m.List("lease") {
		got = append(got, p.ID())
	}
	if strings.Join(got, ",") != strings.Join(ids[2:], ",") {
		t.Fatalf("kept %v, want %v", got, ids[2:])
	}
}

func TestReleaseLeaseKillsAndForgets(t *testing.T) {
	dir := t.TempDir()
	m := newManager(t, Config{StateDir: dir})
	p := start(t, m, StartRequest{Spec: sh("sleep 1000 & echo $!; wait")})
	s, _ := p.Subscribe(0)
	var out bytes.Buffer
	readUntil(t, s, &out, "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(out.String()))
	m.ReleaseLease("lease")
	if pidAlive(pid) {
		t.Fatalf("sleep %d survived the release", pid)
	}
	if _, err := m.Get("lease", p.ID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after release: %v", err)
	}
	if recs, _, _ := (store{dir}).load(); len(recs) != 0 {
		t.Fatalf("records left: %+v", recs)
	}
}

// A process that was running when the daemon stopped is "lost" after a restart, with no
// exit code; one that had ended keeps its exit status.
func TestLostAfterRestart(t *testing.T) {
	dir := t.TempDir()
	ex := newTestExecer(t)
	m1 := newManager(t, Config{StateDir: dir, Execer: ex})
	running := start(t, m1, StartRequest{ID: "server", Spec: Spec{Argv: []string{"sleep", "1000"}}})
	ended := start(t, m1, StartRequest{ID: "job", Spec: sh("exit 4")})
	waitDone(t, ended)
	m1.Shutdown(t.Context())
	if _, _, err := m1.Start(t.Context(), "lease", StartRequest{Spec: sh("true")}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Shutdown: %v", err)
	}
	select {
	case <-running.Done():
		t.Fatal("Shutdown killed a process")
	default:
	}

	m2, err := New(Config{StateDir: dir, Execer: ex})
	if err != nil {
		t.Fatal(err)
	}
	lost, err := m2.Get("lease", "server")
	if err != nil {
		t.Fatal(err)
	}
	if st := lost.Status(); st.State != apitype.ProcessLost || st.ExitCode != nil || st.EndedAt != nil || st.Argv[0] != "sleep" {
		t.Fatalf("lost status %+v", st)
	}
	if s, err := lost.Subscribe(12345); err != nil {
		t.Fatalf("resume on a lost process: %v", err)
	} else if _, err := s.Next(t.Context()); !errors.Is(err, io.EOF) {
		t.Fatalf("Next on a lost process: %v", err)
	}
	if err := m2.Signal("lease", "server", "KILL"); !errors.Is(err, ErrExited) {
		t.Fatalf("signal to a lost process: %v", err)
	}
	old, err := m2.Get("lease", "job")
	if err != nil {
		t.Fatal(err)
	}
	if st := old.Status(); st.State != apitype.ProcessExited || *st.ExitCode != 4 {
		t.Fatalf("ended status %+v", st)
	}
	// A third start still says lost, and the same id is not reused while known.
	m3, err := New(Config{StateDir: dir, Execer: ex})
	if err != nil {
		t.Fatal(err)
	}
	if p, created, err := m3.Start(t.Context(), "lease", StartRequest{ID: "server", Spec: sh("true")}); err != nil || created || p.Status().State != apitype.ProcessLost {
		t.Fatalf("Start on a lost id: %v %v", created, err)
	}
	m1.ReleaseLease("lease") // kills the sleep and removes the records
	m4, err := New(Config{StateDir: dir, Execer: ex})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(m4.List("lease")); n != 0 {
		t.Fatalf("%d records after release", n)
	}
}

func TestReleaseLeaseKillsExec(t *testing.T) {
	ex := newTestExecer(t)
	m := newManager(t, Config{Execer: ex})
	pidFile := ex.dir + "/pid"
	type result struct {
		res ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := m.Exec(context.Background(), "lease", ExecRequest{Spec: sh("sleep 1000 & echo $! > pid; wait")})
		done <- result{res, err}
	}()
	waitFor(t, "the pid file", func() bool { b, _ := os.ReadFile(pidFile); return strings.HasSuffix(string(b), "\n") })
	m.ReleaseLease("lease")
	r := <-done
	if r.err != nil || r.res.Signal != "KILL" {
		t.Fatalf("result %+v, %v", r.res, r.err)
	}
	b, _ := os.ReadFile(pidFile)
	if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid == 0 || pidAlive(pid) {
		t.Fatalf("grandchild %d survived the release", pid)
	}
}

func TestShutdownEndsSubscriptions(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"sleep", "1000"}}, Timeout: time.Hour})
	s, err := p.Subscribe(-1)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := s.Next(context.Background()); errc <- err }()
	m.Shutdown(t.Context())
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Shutdown: %v", err)
	}
	if _, err := m.Exec(t.Context(), "lease", ExecRequest{Spec: sh("true")}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Exec after Shutdown: %v", err)
	}
}

// startHookExecer runs after() right after each command started, before Exec has
// registered its run: the window a ReleaseLease must not slip through.
type startHookExecer struct {
	*testExecer
	after func()
}

type startHookTree struct {
	Tree
	after func()
}

func (e startHookExecer) Command(leaseID string, spec Spec) (*exec.Cmd, Tree, error) {
	cmd, tree, err := e.testExecer.Command(leaseID, spec)
	return cmd, startHookTree{tree, e.after}, err
}

func (t startHookTree) Start() error {
	err := t.Tree.Start()
	t.after()
	return err
}

// A ReleaseLease that comes between an Exec's start and its registration still ends it.
func TestReleaseLeaseKillsExecStartingMeanwhile(t *testing.T) {
	var m *Manager
	m = newManager(t, Config{Execer: startHookExecer{newTestExecer(t), func() { m.ReleaseLease("lease") }}})
	done := make(chan ExecResult, 1)
	go func() {
		res, _ := m.Exec(context.Background(), "lease", ExecRequest{Spec: sh("sleep 1000")})
		done <- res
	}()
	// Before, the run was missed and slept on: this waited for the test's timeout.
	if res := <-done; res.Signal != "KILL" {
		t.Fatalf("result %+v, want killed", res)
	}
}
