package process

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// feed writes out to a fresh capture in writes of step bytes and returns stdout's result.
func feed(limit, head, budget int64, out []byte, step int) streamResult {
	c := newCapture(limit, head, newBudget(budget))
	defer c.release()
	for p := out; len(p) > 0; p = p[min(step, len(p)):] {
		c.write(apitype.ChannelStdout, p[:min(step, len(p))])
	}
	return c.result(0)
}

// A stream over the limit keeps its first head bytes and its last limit-head, whatever
// the sizes of the writes, and counts exactly what it dropped.
func TestCaptureKeepsHeadAndTail(t *testing.T) {
	const limit = 10000
	var b strings.Builder
	for i := 0; b.Len() < 3*limit; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	all := []byte(b.String())
	for _, size := range []int{0, 1, limit - 1, limit, limit + 1, 2*limit + 7, len(all)} {
		out := all[:size]
		for _, head := range []int64{0, 1, limit / 2, limit - 1, limit} {
			for _, step := range []int{1, 7, 4096, limit + 3, len(all)} {
				r := feed(limit, head, 1<<30, out, step)
				want, dropped, at := string(out), int64(0), int64(0)
				if size > limit {
					want = string(out[:head]) + string(out[size-int(limit-head):])
					dropped, at = int64(size-limit), head
				}
				if r.out != want || r.dropped != dropped || r.at != at || r.truncated != (dropped > 0) {
					t.Fatalf("size %d head %d step %d: kept %d bytes, dropped %d at %d (truncated %v); want %d, %d at %d",
						size, head, step, len(r.out), r.dropped, r.at, r.truncated, len(want), dropped, at)
				}
			}
		}
	}
}

// Wherever the cut falls in multi-byte characters, the head and the tail stay whole
// characters: the pieces of a cut one are counted as dropped, and at counts the head's
// characters, so the parts decode alone and split where a client looks for them.
func TestCaptureCutsBetweenCharacters(t *testing.T) {
	const limit, head = 1024, 512
	pattern := "aé€😀" // 1, 2, 3 and 4 bytes
	for shift := range 10 {
		out := []byte(strings.Repeat("x", shift) + strings.Repeat(pattern, 300))
		r := feed(limit, head, 1<<30, out, 333)
		if !utf8.ValidString(r.out) {
			t.Fatalf("shift %d: kept output is not valid UTF-8", shift)
		}
		h, tail := apitype.OutputParts(r.out, r.dropped, r.at)
		if !bytes.HasPrefix(out, []byte(h)) || !bytes.HasSuffix(out, []byte(tail)) ||
			len(h) > head || len(h) < head-3 || len(tail) > limit-head || len(tail) < limit-head-3 {
			t.Fatalf("shift %d: head %d bytes, tail %d bytes: not the output's ends", shift, len(h), len(tail))
		}
		if r.dropped != int64(len(out)-len(r.out)) || r.at != int64(utf8.RuneCountInString(h)) {
			t.Fatalf("shift %d: dropped %d at %d, kept %d of %d", shift, r.dropped, r.at, len(r.out), len(out))
		}
	}
}

// A buffer the budget keeps below the limit is split in the same proportion.
func TestCaptureSplitsWhatTheBudgetGrants(t *testing.T) {
	const limit, head = 64 << 10, 16 << 10 // a quarter from the start
	out := bytes.Repeat([]byte("0123456789abcdef"), limit/4)
	r := feed(limit, head, 12<<10, out, 1000) // 4 KiB outside the budget + 12 KiB
	if len(r.out) != 16<<10 || r.dropped != int64(len(out)-16<<10) || r.at != 4<<10 ||
		r.out != string(out[:4<<10])+string(out[len(out)-12<<10:]) {
		t.Fatalf("kept %d bytes, dropped %d at %d", len(r.out), r.dropped, r.at)
	}
}

func TestHeadBytesBounds(t *testing.T) {
	for _, h := range []int64{-1, 1001} {
		if _, err := headBytes(&h, 1000); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "SIDECAR_MAX_OUTPUT_BYTES") {
			t.Fatalf("head %d: %v, want ErrInvalid naming the setting", h, err)
		}
	}
	if h, err := headBytes(nil, 1000); h != 500 || err != nil {
		t.Fatalf("default head %d %v, want 500", h, err)
	}
}
