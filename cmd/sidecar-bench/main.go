// Command sidecar-bench measures the sidecar daemon side by side with OpenSSH (its peer:
// ssh, scp, tar over ssh, rsync) and with the floor of the machine (local fork/exec, a
// local tar pipe, raw TLS 1.3 on loopback, sha-256 in Go), all in one run so the ratios
// hold on a noisy machine. It starts the daemon it measures and a throwaway sshd on
// loopback, interleaves the contenders of every case (A B C A B C …) after a warm-up, and
// prints a Markdown table of medians, spreads and ratios. It needs root (the daemon runs
// with strict isolation, sshd as root) and cleans up what it started.
//
// It is not a test: `make bench` runs it, `make bench-quick` runs a reduced set.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sidecar-sandbox/sidecar/internal/daemontest"
	"golang.org/x/sys/unix"
)

// caseNames are the cases -only accepts, in the order they run.
var caseNames = []string{"exec", "idle", "lease", "scale", "file", "tree", "stream", "pty", "script", "load"}

// sshFree are the cases with no ssh contender: a run of only these starts no sshd (the
// VM's ratio benchmark, test/vm/run with VM_BENCH, has none).
var sshFree = []string{"scale", "script", "load"}

func main() {
	var (
		quick   = flag.Bool("quick", false, "reduced sizes and repetitions (under two minutes)")
		only    = flag.String("only", "", "comma-separated cases to run: "+strings.Join(caseNames, ","))
		out     = flag.String("out", "", "also write the Markdown report to this file")
		bin     = flag.String("bin", "bin/sidecar", "the daemon binary to measure (sidecar-init must sit next to it)")
		verbose = flag.Bool("v", false, "log progress at debug level")
		http1   = flag.Bool("http1", false, "make the client speak HTTP/1.1 instead of HTTP/2 (to attribute transfer costs)")
		tree    = flag.Int("tree-files", 0, "files in the tree case (0: the size's default; 50 per directory)")
		leases  = flag.Int("leases", 0, "leases in the load case (0: the size's default)")
		loadFor = flag.Duration("load-for", 0, "how long each phase of the load case runs (0: the size's default)")
		envdBin = flag.String("envd", "", "E2B's envd binary, built outside this repository: a second peer for the exec and idle cases (docs/benchmarks.md)")
	)
	flag.Parse()
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	cases, err := selectCases(*only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidecar-bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sz := fullSizes
	if *quick {
		sz = quickSizes
	}
	if *tree > 0 {
		sz.treeFiles, sz.treeDirs = *tree, max(1, *tree/50)
	}
	if *leases > 0 {
		sz.leases = *leases
	}
	if *loadFor > 0 {
		sz.loadFor = *loadFor
	}
	if err := run(ctx, log, runConfig{bin: *bin, envd: *envdBin, sizes: sz, cases: cases, out: *out, quick: *quick, http1: *http1}); err != nil {
		log.Error("benchmark failed", "err", err)
		os.Exit(1)
	}
}

// selectCases parses -only; empty means every case.
func selectCases(only string) (map[string]bool, error) {
	sel := map[string]bool{}
	if only == "" {
		for _, n := range caseNames {
			sel[n] = true
		}
		return sel, nil
	}
	for n := range strings.SplitSeq(only, ",") {
		n = strings.TrimSpace(n)
		known := false
		for _, k := range caseNames {
			known = known || k == n
		}
		if !known {
			return nil, fmt.Errorf("unknown case %q (known: %s)", n, strings.Join(caseNames, ","))
		}
		sel[n] = true
	}
	return sel, nil
}

// needsSSH says whether any selected case has an ssh contender.
func needsSSH(cases map[string]bool) bool {
	for n := range cases {
		if !slices.Contains(sshFree, n) {
			return true
		}
	}
	return false
}

// runConfig is what the flags decided.
type runConfig struct {
	bin   string
	envd  string // -envd: the peer binary, or ""
	sizes sizes
	cases map[string]bool
	out   string
	quick bool
	http1 bool
}

func run(ctx context.Context, log *slog.Logger, rc runConfig) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("sidecar-bench needs root: the daemon runs with SIDECAR_ISOLATION=strict and sshd as root")
	}
	// /var/tmp, not /tmp: a lease's private /tmp would hide a work root under /tmp.
	dir, err := os.MkdirTemp("/var/tmp", "sidecar-bench-")
	if err != nil {
		return err
	}
	// Lease uids must traverse it to reach their workdirs under dir/leases.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	defer func() {
		if rerr := daemontest.RemoveTree(dir); rerr != nil {
			log.Warn("temporary directory left behind", "dir", dir, "err", rerr)
		}
	}()
	unshare, err := shareLeases(filepath.Join(dir, "leases"))
	if err != nil {
		return err
	}
	defer unshare(log)
	b := &bench{log: log, dir: dir, sz: rc.sizes, quick: rc.quick, http1: rc.http1}
	b.machineBefore = readMachine()

	log.Info("starting the daemon", "bin", rc.bin)
	b.d, err = startDaemon(ctx, log, rc.bin, dir, max(rc.sizes.leases, slices.Max(rc.sizes.scaleHeld)+1))
	if err != nil {
		return err
	}
	defer b.d.stop(log)
	if b.c, err = b.d.client(rc.http1); err != nil {
		return err
	}
	b.ssh = &sshd{cipher: "none (no ssh case)"}
	if needsSSH(rc.cases) {
		log.Info("starting sshd")
		b.ssh, err = startSSHD(ctx, log, dir)
		if err != nil {
			return err
		}
		defer b.ssh.stop(log)
		if err := b.ssh.pickCipher(ctx, rc.sizes.cipherProbeBytes); err != nil {
			return err
		}
		log.Info("cipher chosen", "cipher", b.ssh.cipher, "probe", b.ssh.cipherNote)
		if err := b.ssh.startMaster(ctx); err != nil {
			return err
		}
	}

	if rc.envd != "" && (rc.cases["exec"] || rc.cases["idle"]) {
		log.Info("starting envd", "bin", rc.envd)
		if b.envd, err = startEnvd(ctx, log, rc.envd); err != nil {
			return err
		}
		defer b.envd.stop(log)
	}

	steps := map[string]func(context.Context) error{
		"exec": b.caseExec, "idle": b.caseIdle, "lease": b.caseLease, "scale": b.caseScale, "file": b.caseFile, "tree": b.caseTree,
		"stream": b.caseStream, "pty": b.casePTY, "script": b.caseScript, "load": b.caseLoad,
	}
	for _, name := range caseNames {
		if !rc.cases[name] {
			continue
		}
		log.Info("case", "name", name)
		if err := steps[name](ctx); err != nil {
			b.failures = append(b.failures, fmt.Sprintf("%s: %v", name, err))
			log.Error("case failed", "name", name, "err", err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	b.daemonStatus = b.d.status()
	report := b.report()
	fmt.Print(report)
	if rc.out != "" {
		if werr := os.WriteFile(rc.out, []byte(report), 0o644); werr != nil {
			return werr
		}
	}
	if len(b.failures) > 0 {
		// The temporary directory goes at return; the daemon's side of a failure stays.
		kept := dir + "-daemon.log"
		if werr := os.WriteFile(kept, []byte(tail(b.d.logPath, 1<<20)), 0o644); werr != nil {
			return fmt.Errorf("%d case(s) failed; the daemon's log is lost: %w", len(b.failures), werr)
		}
		return fmt.Errorf("%d case(s) failed; the daemon's log (its last MiB) is kept in %s", len(b.failures), kept)
	}
	return ctx.Err()
}

// sizes scale a run: full for the table, quick for development.
type sizes struct {
	fileBytes        int64 // the big file up and down
	cipherProbeBytes int64
	treeFiles        int // 4 KiB files in treeDirs directories
	treeDirs         int
	streamBytes      int64
	leases           int
	loadFor          time.Duration
	reps             int // small cases (exec, lease lifecycle)
	bigReps          int // big-file and stream cases
	treeReps         int
	treeWarmup       int
	ptyRounds        int
	scriptRuns       int
	scaleHeld        []int // leases held at each point of the lease-count curve
}

var fullSizes = sizes{
	fileBytes: 1 << 30, cipherProbeBytes: 256 << 20, treeFiles: 10000, treeDirs: 200, streamBytes: 1 << 30,
	leases: 100, loadFor: 30 * time.Second, reps: 30, bigReps: 3, treeReps: 3, treeWarmup: 1, ptyRounds: 300, scriptRuns: 100,
	scaleHeld: []int{10, 100, 1000},
}

var quickSizes = sizes{
	fileBytes: 64 << 20, cipherProbeBytes: 128 << 20, treeFiles: 1000, treeDirs: 20, streamBytes: 64 << 20,
	leases: 20, loadFor: 5 * time.Second, reps: 10, bigReps: 3, treeReps: 2, treeWarmup: 0, ptyRounds: 100, scriptRuns: 100,
	scaleHeld: []int{10, 100},
}

// shareLeases makes the daemon's work root a shared mount (a bind mount of itself), so the
// lease filesystems the daemon mounts under it also appear in sshd's mount namespace
// (made earlier, as a slave: see sshdCommand), where the ssh peers of the tree case
// write. The returned func unmounts it once the daemon has released its leases.
func shareLeases(dir string) (func(*slog.Logger), error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind mount the work root: %w", err)
	}
	undo := func(log *slog.Logger) {
		if err := unix.Unmount(dir, 0); err != nil {
			log.Warn("work root still mounted", "dir", dir, "err", err)
		}
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED, ""); err != nil {
		undo(slog.Default())
		return nil, fmt.Errorf("make the work root shared: %w", err)
	}
	return undo, nil
}
