package testtool

import (
	"debug/elf"
	"os/exec"
	"regexp"
	"testing"
)

var lddPath = regexp.MustCompile(`(?m)(?:=> )?(/\S+) \(0x`)

// Libraries are the shared libraries the host program at path loads, loader included, so
// that a test image holding it can run it. A static program (no ELF interpreter, as
// busybox-static's in the VM tests) has none and needs no ldd.
func Libraries(t testing.TB, path string) []string {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	static := true
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			static = false
		}
	}
	f.Close()
	if static {
		return nil
	}
	ldd := Need(t, "ldd", "libc-bin", "it lists the libraries of the programs a test image holds")
	out, err := exec.Command(ldd, path).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", path, err)
	}
	var libs []string
	for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	return libs
}
