package seccomp

import "testing"

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
