package process

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
)

// Messages joins chunks of one channel that are already there, never across channels
// nor past MaxMessageBytes, sends at once what is there when nothing more is, and keeps
// every byte in order: the messages make exactly the stream that was written.
func TestMessagesJoinWhatIsThere(t *testing.T) {
	const k = 1 << 10
	l := newOutLog(16<<20, nil)
	sub := &Subscription{log: l, closed: make(chan struct{})}
	ms := NewMessages(sub)
	ctx := context.Background()
	var want, got [3]bytes.Buffer // by channel
	var fill byte
	write := func(ch byte, n int) {
		fill++
		p := bytes.Repeat([]byte{fill}, n)
		want[ch].Write(p)
		l.write(ch, p)
	}
	type msg struct {
		ch byte
		n  int
	}
	next := func() msg {
		t.Helper()
		m, err := ms.Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		got[m.Channel].Write(m.Data)
		m.Release()
		return msg{m.Channel, len(m.Data)}
	}
	expect := func(what string, want msg) {
		t.Helper()
		if m := next(); m != want {
			t.Fatalf("%s: message of %d bytes on channel %d, want %d on %d", what, m.n, m.ch, want.n, want.ch)
		}
	}

	write(1, 40*k)
	expect("alone, with nothing more there", msg{1, 40 * k})
	write(1, 30*k) // grows the chunk the reader is in (70 KiB)
	write(1, 60*k) // would pass a chunk's limit: a new chunk
	write(1, 20*k) // grows that one (80 KiB)
	expect("the rest of a chunk joined with the next", msg{1, 30*k + 80*k})

	write(1, 40*k)
	write(2, 5*k)
	write(1, 7*k)
	expect("up to the other channel", msg{1, 40 * k})
	expect("the other channel alone", msg{2, 5 * k})
	expect("back on the first channel", msg{1, 7 * k})

	write(1, 10*k)
	write(1, 120*k) // a chunk of its own (130 KiB would pass the limit)
	expect("not joined past MaxMessageBytes", msg{1, 10 * k})
	expect("the big chunk", msg{1, 120 * k})

	write(2, 3*k)
	l.close()
	expect("the last bytes before the end", msg{2, 3 * k})
	if _, err := ms.Next(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last message: %v, want io.EOF", err)
	}
	for ch := range want {
		if !bytes.Equal(got[ch].Bytes(), want[ch].Bytes()) {
			t.Errorf("channel %d: %d bytes arrived, not the %d written in order", ch, got[ch].Len(), want[ch].Len())
		}
	}
}

// Poll delivers what is there without waiting, reports nothing there yet, then the end.
func TestSubscriptionPoll(t *testing.T) {
	l := newOutLog(MinBufferBytes, nil)
	sub := &Subscription{log: l, closed: make(chan struct{})}
	if _, ok, err := sub.Poll(); ok || err != nil {
		t.Fatalf("Poll of nothing = %v, %v; want not ok, nil", ok, err)
	}
	l.write(1, []byte("hi"))
	if c, ok, err := sub.Poll(); !ok || err != nil || string(c.Data) != "hi" || c.Channel != 1 {
		t.Fatalf("Poll = %q on %d, %v, %v", c.Data, c.Channel, ok, err)
	}
	l.close()
	if _, ok, err := sub.Poll(); ok || !errors.Is(err, io.EOF) {
		t.Fatalf("Poll at the end = %v, %v; want io.EOF", ok, err)
	}
	sub.Close()
	if _, _, err := sub.Poll(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Poll after Close = %v, want ErrClosed", err)
	}
}
