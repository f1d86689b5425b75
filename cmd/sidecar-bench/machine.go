package main

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// machine describes where the figures were taken.
type machine struct {
	date, kernel, cpu, memory, load string
	nproc                           int
}

func readMachine() machine {
	m := machine{date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), nproc: runtime.NumCPU()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.kernel = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			m.load = strings.Join(f[:3], " ")
		}
	}
	m.cpu = firstField("/proc/cpuinfo", "model name")
	if kb, err := strconv.ParseInt(strings.TrimSuffix(firstField("/proc/meminfo", "MemTotal"), " kB"), 10, 64); err == nil {
		m.memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
	}
	return m
}

// firstField is the value of the first "key: value" line of a /proc file.
func firstField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
