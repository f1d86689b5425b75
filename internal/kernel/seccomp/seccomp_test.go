package seccomp

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

const cHelperSource = "../../../cmd/sidecar-init/sidecar-init.c"

// The C helper denies the same calls by the same names, and its numbers for the calls an
// old libseccomp may not know agree with this architecture's.
func TestDenylistParity(t *testing.T) {
	src, err := os.ReadFile(cHelperSource)
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile(`(?s)seccomp_denied\[\] = \{(.*?)\n\};`).FindSubmatch(src)
	if block == nil {
		t.Fatal("no seccomp_denied[] in the C helper")
	}
	var names []string
	for _, m := range regexp.MustCompile(`"(\w+)"`).FindAllSubmatch(block[1], -1) {
		names = append(names, string(m[1]))
	}
	if !slices.Equal(names, Denied) {
		t.Errorf("C helper denies\n%q\nGo helper denies\n%q", names, Denied)
	}
	calls := regexp.MustCompile(`(?s)seccomp_new_calls\[\] = \{(.*?)\n\};`).FindSubmatch(src)
	if calls == nil {
		t.Fatal("no seccomp_new_calls[] in the C helper")
	}
	known := map[string]uint32{"clone3": unix.SYS_CLONE3}
	maps := regexp.MustCompile(`\{"(\w+)", (\d+)\}`).FindAllSubmatch(calls[1], -1)
	if len(maps) == 0 {
		t.Fatal("seccomp_new_calls[] is empty")
	}
	for _, m := range maps {
		name, nr := string(m[1]), string(m[2])
		want, ok := syscalls[name]
		if !ok {
			want, ok = known[name]
		}
		if !ok && archOK {
			t.Errorf("C helper numbers %s, which Denied lacks", name)
		} else if archOK && strconv.Itoa(int(want)) != nr {
			t.Errorf("C helper numbers %s %s, x/sys/unix %d", name, nr, want)
		}
	}
}

// The C helper allows the socket families package seccomp allows, and its largest is the
// bound above which it refuses every family.
func TestSocketFamiliesParity(t *testing.T) {
	src, err := os.ReadFile(cHelperSource)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`socket_families\[\] = \{([^}]*)\};\s*#define SOCKET_FAMILY_MAX (\w+)`).FindSubmatch(src)
	if m == nil {
		t.Fatal("no socket_families[] and SOCKET_FAMILY_MAX in the C helper")
	}
	byName := map[string]uint32{"AF_UNIX": unix.AF_UNIX, "AF_INET": unix.AF_INET, "AF_INET6": unix.AF_INET6, "AF_NETLINK": unix.AF_NETLINK}
	var got []uint32
	for _, name := range regexp.MustCompile(`AF_\w+`).FindAllString(string(m[1]), -1) {
		v, ok := byName[name]
		if !ok {
			t.Fatalf("C helper allows %s, which this test does not know", name)
		}
		got = append(got, v)
	}
	if !slices.Equal(got, SocketFamilies) {
		t.Errorf("C helper allows families %v, Go helper %v", got, SocketFamilies)
	}
	if byName[string(m[2])] != slices.Max(SocketFamilies) {
		t.Errorf("SOCKET_FAMILY_MAX is %s, not the largest allowed family", m[2])
	}
}

// The program assembles on this architecture with every denied call it has.
func TestProgram(t *testing.T) {
	if !archOK {
		t.Skip("no filter for this architecture")
	}
	prog, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	if len(prog) < len(syscalls)+10 {
		t.Errorf("%d instructions for %d denied calls", len(prog), len(syscalls))
	}
	if !Available() {
		t.Error("Available() = false on a kernel with seccomp filters")
	}
}
