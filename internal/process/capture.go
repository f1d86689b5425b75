package process

import (
	"fmt"
	"unicode/utf8"
	"unsafe"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// minCapture is the first allocation of a capture stream, outside the budget: most
// outputs are small, and these always arrive whole however much big ones hold.
const minCapture = 4 << 10

// capture keeps at most limit bytes of stdout and of stderr: all of a stream that fits,
// else its first head bytes and its last limit-head bytes, counting what it dropped in
// between. Buffer capacity beyond minCapture is charged to the daemon's output budget;
// a stream whose buffer cannot grow to limit splits what it has in the same proportion.
// Each stream has its own pump goroutine and its own slot, and the budget is atomic, so
// no lock is needed; the result is read after the pumps ended.
type capture struct {
	limit   int64
	head    int64 // 0..limit
	budget  *budget
	streams [2]stream
}

// stream is one captured stream. While it fits, buf holds it from its first byte. Once
// a write finds buf full and unable to grow, buf[:ring] is the head, kept for good, and
// buf[ring:] a ring of the latest bytes whose oldest is at next.
type stream struct {
	buf     []byte
	charged int64 // capacity taken from the budget
	ring    int   // -1 until the stream outgrew its buffer
	next    int
	dropped int64 // bytes between the head and the tail that are gone
	lost    bool  // output was lost before it reached write (Capture.Truncate)
	ended   bool  // end ran: buf is head then tail, in order
	at      int64 // after end: the head's length in characters (see apitype.ExecResult)
}

func newCapture(limit, head int64, b *budget) *capture {
	c := &capture{limit: limit, head: min(max(head, 0), limit), budget: b}
	c.streams[0].ring, c.streams[1].ring = -1, -1
	return c
}

// headBytes is how many of a stream's limit bytes come from its start: h, or half of
// limit when h is nil. Anything outside 0..limit is ErrInvalid.
func headBytes(h *int64, limit int64) (int64, error) {
	if h == nil {
		return limit / 2, nil
	}
	if *h < 0 || *h > limit {
		return 0, fmt.Errorf("%w: output_head_bytes %d outside 0..%d (SIDECAR_MAX_OUTPUT_BYTES)", ErrInvalid, *h, limit)
	}
	return *h, nil
}

func (c *capture) write(channel byte, p []byte) bool {
	s := &c.streams[channel-apitype.ChannelStdout]
	if s.ended {
		return false // the result is taken: it must not change
	}
	if s.ring < 0 {
		c.grow(s, len(p))
		n := min(len(p), cap(s.buf)-len(s.buf))
		s.buf = append(s.buf, p[:n]...)
		if p = p[n:]; len(p) == 0 {
			return false
		}
		// Full for good: from here on every byte written drops one, itself or the
		// oldest of the tail.
		s.ring = c.headOf(cap(s.buf))
		s.next = s.ring
	}
	s.dropped += int64(len(p))
	size := len(s.buf) - s.ring
	if size == 0 {
		return false
	}
	p = p[max(len(p)-size, 0):]
	n := copy(s.buf[s.next:], p)
	if n < len(p) {
		s.next = s.ring + copy(s.buf[s.ring:], p[n:])
	} else if s.next += n; s.next == len(s.buf) {
		s.next = s.ring
	}
	return false
}

// grow makes room for n more bytes in s.buf when the limit and the budget allow: by
// doubling (bounded by the limit) when the budget allows, else by what this write needs,
// else by what is left of the budget.
func (c *capture) grow(s *stream, n int) {
	if cap(s.buf) == 0 && n > 0 {
		s.buf = make([]byte, 0, min(minCapture, c.limit))
	}
	need := min(int64(len(s.buf)+n), c.limit)
	have := int64(cap(s.buf))
	if need <= have {
		return
	}
	want := min(max(2*have, need, minCapture), c.limit)
	got := c.budget.take(want - have)
	if got < want-have {
		c.budget.give(got)
		got = c.budget.take(need - have)
	}
	if got > 0 {
		grown := make([]byte, len(s.buf), have+got)
		copy(grown, s.buf)
		s.buf = grown
		s.charged += got
	}
}

// headOf is the head of a full buffer of size bytes: head, or its share of size when the
// budget kept the buffer below limit.
func (c *capture) headOf(size int) int {
	if int64(size) >= c.limit {
		return int(c.head)
	}
	return int(float64(size) * float64(c.head) / float64(c.limit))
}

// end puts a stream that outgrew its buffer in order: the head, then the tail from its
// oldest byte. Neither part keeps a piece of a character cut by the drop (the head's last
// incomplete UTF-8 sequence, the tail's leading continuation bytes, counted as dropped),
// so that head and tail decode on their own and at is a character boundary of the
// whole, in JSON and in every client.
func (s *stream) end() {
	if s.ended {
		return
	}
	s.ended = true
	if s.ring < 0 {
		return
	}
	rotate(s.buf[s.ring:], s.next-s.ring)
	head, tail := s.buf[:s.ring], s.buf[s.ring:]
	for i := len(head) - 1; i >= 0 && i >= len(head)-utf8.UTFMax; i-- {
		if utf8.RuneStart(head[i]) {
			if !utf8.FullRune(head[i:]) {
				head = head[:i]
			}
			break
		}
	}
	skip := 0
	for skip < len(tail) && skip < utf8.UTFMax-1 && !utf8.RuneStart(tail[skip]) {
		skip++
	}
	s.dropped += int64(s.ring-len(head)) + int64(skip)
	n := copy(s.buf[len(head):], tail[skip:])
	s.buf = s.buf[:len(head)+n]
	s.at = int64(utf8.RuneCount(head))
}

// rotate turns b left by k bytes in place (three reversals: no second buffer).
func rotate(b []byte, k int) {
	reverse := func(b []byte) {
		for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
			b[i], b[j] = b[j], b[i]
		}
	}
	reverse(b[:k])
	reverse(b[k:])
	reverse(b)
}

// result ends stream i and returns it without a copy (the bytes never change once the
// pumps ended), with what was dropped.
func (c *capture) result(i int) streamResult {
	s := &c.streams[i]
	s.end()
	r := streamResult{truncated: s.dropped > 0 || s.lost, dropped: s.dropped, at: s.at}
	if len(s.buf) > 0 {
		r.out = unsafe.String(unsafe.SliceData(s.buf), len(s.buf))
	}
	return r
}

type streamResult struct {
	out       string
	truncated bool
	dropped   int64
	at        int64
}

// release gives the buffers' capacity back to the budget.
func (c *capture) release() {
	for i := range c.streams {
		c.budget.give(c.streams[i].charged)
		c.streams[i].charged = 0
	}
}

// Capture is an Exec's output capture for a caller that collects a command's output
// itself (a shell session's command, framed out of its shell's longer stream): the same
// MaxOutputBytes per stream kept as head and tail, the same first 4 KiB outside the
// budget, and beyond them the same daemon-wide OutputBudgetBytes that every Exec shares,
// so that no output a request holds escapes it. What neither grants is dropped, counted
// and flagged truncated; Write never blocks. Not safe for concurrent use.
type Capture struct{ c *capture }

// NewCapture returns an empty Capture on the Manager's limit and budget that keeps
// head bytes of each stream's start (nil: half of MaxOutputBytes; beyond 0..MaxOutputBytes
// ErrInvalid). The caller must Release it, once the output's reply is written.
func (m *Manager) NewCapture(head *int64) (*Capture, error) {
	h, err := headBytes(head, m.cfg.MaxOutputBytes)
	if err != nil {
		return nil, err
	}
	return &Capture{c: newCapture(m.cfg.MaxOutputBytes, h, m.output)}, nil
}

// Write keeps what the limit and the budget allow of p (channel is apitype.ChannelStdout
// or ChannelStderr) and counts the rest dropped. p is not kept.
func (c *Capture) Write(channel byte, p []byte) { c.c.write(channel, p) }

// Truncate flags a stream truncated: output was lost before it reached Write.
func (c *Capture) Truncate(channel byte) { c.c.streams[channel-apitype.ChannelStdout].lost = true }

// Output returns what a stream kept and whether it was truncated. The string shares memory
// with the Capture (no copy outside the budget): no Write may follow, and it is counted
// only until Release.
func (c *Capture) Output(channel byte) (string, bool) {
	r := c.c.result(int(channel - apitype.ChannelStdout))
	return r.out, r.truncated
}

// Dropped returns how many bytes of a stream Output lacks between its head and its tail,
// and where: the head's length in characters (apitype.ExecResult's stdout_dropped_at). No
// Write may follow.
func (c *Capture) Dropped(channel byte) (bytes, at int64) {
	r := c.c.result(int(channel - apitype.ChannelStdout))
	return r.dropped, r.at
}

// Release gives the Capture's share of the budget back. No Write may follow.
func (c *Capture) Release() { c.c.release() }
