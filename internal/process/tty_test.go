package process

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestTTYResizeFollowsStty(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"sh", "-c", "stty size; read x; stty size"}, TTY: true}, Rows: 30, Cols: 100, Stdin: true})
	s, err := p.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	readUntil(t, s, &out, "30 100\r\n")
	if err := p.Resize(50, 132); err != nil {
		t.Fatal(err)
	}
	if _, err := p.WriteStdin([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, s, &out, "50 132\r\n")
	if !strings.Contains(out.String(), "go\r\n") {
		t.Fatalf("no echo of the input in %q", out.String())
	}
	waitDone(t, p)
}

func TestTTYCloseStdinEndsCat(t *testing.T) {
	for _, tc := range []struct {
		name, input, echoed string
	}{
		{"at line start", "hello\n", "hello\r\nhello\r\n"},
		{"after a partial line", "partial", "partial"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newManager(t, Config{})
			p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"cat"}, TTY: true}, Stdin: true})
			s, err := p.Subscribe(0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.WriteStdin([]byte(tc.input)); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			readUntil(t, s, &out, tc.echoed)
			if err := p.CloseStdin(); err != nil {
				t.Fatal(err)
			}
			waitDone(t, p)
			if st := p.Status(); *st.ExitCode != 0 {
				t.Fatalf("status %+v", st)
			}
			if _, err := p.WriteStdin([]byte("x")); !errors.Is(err, ErrStdinClosed) {
				t.Fatalf("write after close: %v", err)
			}
		})
	}
}

// Attaching live (since = -1) to a TTY nudges the size, so the program gets SIGWINCH
// and can repaint; the size ends where it was.
func TestTTYAttachRedraws(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, StartRequest{Spec: helperSpec(t, "winch", true), Stdin: true})
	first, err := p.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	readUntil(t, first, &out, "ready")
	live, err := p.Subscribe(-1)
	if err != nil {
		t.Fatal(err)
	}
	var seen bytes.Buffer
	readUntil(t, live, &seen, "winch ")
	readUntil(t, live, &seen, "\n")
	if !strings.Contains(seen.String(), "winch 24 81") && !strings.Contains(seen.String(), "winch 24 80") {
		t.Fatalf("redraw signal reported %q", seen.String())
	}
	if err := p.Resize(24, 80); err != nil { // no change: no signal, but it must not fail
		t.Fatal(err)
	}
	_ = p.CloseStdin()
	waitDone(t, p)
}

func TestResizeBounds(t *testing.T) {
	m := newManager(t, Config{})
	p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"sleep", "1000"}, TTY: true}})
	for _, size := range [][2]uint16{{0, 80}, {24, 0}, {1001, 80}, {24, 1001}, {65535, 65535}} {
		if err := p.Resize(size[0], size[1]); !errors.Is(err, ErrInvalid) {
			t.Fatalf("Resize%v: %v", size, err)
		}
	}
	if err := p.Resize(1000, 1000); err != nil {
		t.Fatalf("largest size: %v", err)
	}
	if err := p.Redraw(); err != nil { // at MaxCols the nudge goes down
		t.Fatal(err)
	}
	q := start(t, m, StartRequest{Spec: Spec{Argv: []string{"sleep", "1000"}}})
	if err := q.Resize(24, 80); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Resize without a TTY: %v", err)
	}
}

// A TTY attach whose range has left the buffer starts live and redraws instead of
// replaying from the middle of the screen output.
func TestTTYLostRangeStartsLive(t *testing.T) {
	m := newManager(t, Config{BufferBytes: MinBufferBytes})
	p := start(t, m, StartRequest{Spec: Spec{Argv: []string{"sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a; echo; echo done; read x"}, TTY: true}, Stdin: true})
	first, err := p.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	readUntil(t, first, &out, "done")
	st := p.Status()
	if st.OutputStart == 0 {
		t.Fatalf("buffer never wrapped: %+v", st)
	}
	s, err := p.Subscribe(0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Offset() != st.OutputOffset || s.Lost() != st.OutputOffset {
		t.Fatalf("offset %d lost %d, status %+v", s.Offset(), s.Lost(), st)
	}
	// An exact resume inside the buffer still replays.
	exact, err := p.Subscribe(st.OutputStart)
	if err != nil {
		t.Fatal(err)
	}
	if exact.Offset() != st.OutputStart || exact.Lost() != 0 {
		t.Fatalf("exact resume at %d: offset %d lost %d", st.OutputStart, exact.Offset(), exact.Lost())
	}
	_ = p.CloseStdin()
	waitDone(t, p)
}
