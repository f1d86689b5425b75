package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// BenchmarkExec compares /bin/true run as a lease command (child cgroup, namespaces, uid,
// Landlock) through each helper with a plain fork/exec, in one run: read the ratios, not
// the times. "interleaved" runs one of each per iteration, so that the load of a shared
// machine falls on all of them alike, and reports the ratios itself.
func BenchmarkExec(b *testing.B) {
	helpers := benchHelpers(b)
	b.Run("local", func(b *testing.B) {
		for b.Loop() {
			localTrue(b)
		}
	})
	for _, h := range helpers {
		b.Run(h.name+"-helper", func(b *testing.B) {
			s := newTestSandboxWith(b, h.path)
			l := newTestLease(b, s, nil)
			for b.Loop() {
				sandboxTrue(b, s, l.ID)
			}
		})
	}
	// Commands go to launchers (package confine); "-cold" ones start the plain way.
	cold := helpers[len(helpers)-1]
	cold.name += "-cold"
	b.Run(cold.name+"-helper", func(b *testing.B) {
		s := newTestSandboxConfig(b, Config{HelperPath: cold.path, ColdStart: true})
		l := newTestLease(b, s, nil)
		for b.Loop() {
			sandboxTrue(b, s, l.ID)
		}
	})
	b.Run("interleaved", func(b *testing.B) {
		runs := []func(){func() { localTrue(b) }}
		for _, h := range append(slices.Clone(helpers), cold) {
			s := newTestSandboxConfig(b, Config{HelperPath: h.path, ColdStart: h == cold})
			l := newTestLease(b, s, nil)
			runs = append(runs, func() { sandboxTrue(b, s, l.ID) })
		}
		// Wall time, and CPU time (daemon and its children), which a loaded machine
		// distorts less.
		took, cpu := make([]time.Duration, len(runs)), make([]time.Duration, len(runs))
		for b.Loop() {
			for i, run := range runs {
				start, startCPU := time.Now(), cpuTime()
				run()
				took[i] += time.Since(start)
				cpu[i] += cpuTime() - startCPU
			}
		}
		n := float64(b.N)
		local, localCPU := float64(took[0])/n, float64(cpu[0])/n
		b.ReportMetric(local, "local-ns/op")
		b.ReportMetric(localCPU, "local-cpu-ns/op")
		for i, h := range append(slices.Clone(helpers), cold) {
			ns, cpuNs := float64(took[i+1])/n, float64(cpu[i+1])/n
			b.ReportMetric(ns, h.name+"-ns/op")
			b.ReportMetric(ns/local, h.name+"/local")
			b.ReportMetric(cpuNs, h.name+"-cpu-ns/op")
			b.ReportMetric(cpuNs/localCPU, h.name+"/local-cpu")
		}
	})
}

// benchHelpers are the deployed helpers: the Go sidecar-init built as `make build` does
// without a C compiler, and the C one TestMain built.
func benchHelpers(b *testing.B) []testHelper {
	goHelper := filepath.Join(b.TempDir(), "sidecar-init")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", goHelper, "../../cmd/sidecar-init")
	build.Env = append(build.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build the Go sidecar-init: %v\n%s", err, out)
	}
	helpers := []testHelper{{name: "go", path: goHelper}}
	for _, h := range testHelpers {
		if h.name == "c" {
			h.usable(b)
			helpers = append(helpers, h)
		}
	}
	return helpers
}

// cpuTime is the user and system time of this process and its waited-for children.
func cpuTime() time.Duration {
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			panic(err)
		}
		total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return total
}

func localTrue(b *testing.B) {
	if err := exec.Command("/bin/true").Run(); err != nil {
		b.Fatal(err)
	}
}

func sandboxTrue(b testing.TB, s *Sandbox, leaseID string) {
	cmd, tr, err := s.Command(leaseID, Spec{Argv: []string{"/bin/true"}})
	if err != nil {
		b.Fatal(err)
	}
	// Pipes, as package process gives (a launcher takes files only).
	out, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := tr.Start(); err != nil {
		b.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		b.Fatal(err)
	}
	if err := tr.Close(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkExecHelperStart is the bare start cost of each helper: run with no config, it
// fails at once (exit 125), against /bin/true run the same way. No root needed.
func BenchmarkExecHelperStart(b *testing.B) {
	helpers := append([]testHelper{{name: "true", path: "/bin/true"}}, benchHelpers(b)...)
	for _, h := range helpers {
		b.Run(h.name, func(b *testing.B) {
			for b.Loop() {
				err := exec.Command(h.path, HelperArg).Run()
				var ee *exec.ExitError
				if h.name == "true" && err != nil || h.name != "true" && (!errors.As(err, &ee) || ee.ExitCode() != 125) {
					b.Fatalf("%s: %v, want exit 125", h.path, err)
				}
			}
		})
	}
}
