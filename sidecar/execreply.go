package sidecar

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// replyPiece is how much of an output string is encoded at a time: its JSON (up to 6×
// for bytes that are not UTF-8) is all a reply holds beyond the result itself.
const replyPiece = 8 << 10

// writeExecResult writes res exactly as writeJSON would (encoding/json's field order,
// escaping and trailing newline: the wire format of docs/api.md), but encodes the output
// strings piece by piece straight to w, so the reply never exists whole in memory; built
// whole it was about 6× the output for bytes that are not UTF-8 (issue 19).
func writeExecResult(w http.ResponseWriter, res apitype.ExecResult) error {
	r := newReplyWriter(w)
	r.output(res.ExitCode, res.Signal, res.Stdout, res.Stderr, outputMeta{res.StdoutTruncated, res.StderrTruncated,
		res.StdoutDropped, res.StderrDropped, res.StdoutDroppedAt, res.StderrDroppedAt}, res.TimedOut)
	r.flag("oom_killed", res.OOMKilled)
	r.raw(`,"duration_ms":` + strconv.FormatInt(res.DurationMS, 10) + "}\n")
	return r.flush()
}

// writeShellResult is writeExecResult for a shell session command's result.
func writeShellResult(w http.ResponseWriter, res apitype.ShellResult) error {
	r := newReplyWriter(w)
	r.output(res.ExitCode, res.Signal, res.Stdout, res.Stderr, outputMeta{res.StdoutTruncated, res.StderrTruncated,
		res.StdoutDropped, res.StderrDropped, res.StdoutDroppedAt, res.StderrDroppedAt}, res.TimedOut)
	r.flag("ended", res.Ended)
	r.raw(`,"cwd":`)
	r.str(res.Cwd)
	r.raw(`,"duration_ms":` + strconv.FormatInt(res.DurationMS, 10) + "}\n")
	return r.flush()
}

// replyWriter writes a 200 JSON reply field by field, through a 32 KiB buffer; the first
// write error sticks in it and comes out of flush.
type replyWriter struct {
	bw      *bufio.Writer
	scratch bytes.Buffer
	enc     *json.Encoder
}

func newReplyWriter(w http.ResponseWriter) *replyWriter {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	r := &replyWriter{bw: bufio.NewWriterSize(w, 32<<10)}
	r.enc = json.NewEncoder(&r.scratch) // escapes HTML, as writeJSON's encoder does
	return r
}

func (r *replyWriter) raw(s string) { _, _ = r.bw.WriteString(s) }

// str writes s as a JSON string, encoded replyPiece bytes at a time.
func (r *replyWriter) str(s string) {
	_ = r.bw.WriteByte('"')
	for len(s) > 0 {
		n := pieceEnd(s, replyPiece)
		r.scratch.Reset()
		_ = r.enc.Encode(s[:n]) // a string always encodes: "…"\n
		q := r.scratch.Bytes()
		_, _ = r.bw.Write(q[1 : len(q)-2])
		s = s[n:]
	}
	_ = r.bw.WriteByte('"')
}

func (r *replyWriter) flag(name string, v bool) {
	r.raw(`,"` + name + `":` + strconv.FormatBool(v))
}

func (r *replyWriter) int(name string, v int64) {
	r.raw(`,"` + name + `":` + strconv.FormatInt(v, 10))
}

// outputMeta is what an exec's and a shell command's results say of their output
// beyond the output itself.
type outputMeta struct {
	stdoutTruncated, stderrTruncated bool
	stdoutDropped, stderrDropped     int64
	stdoutDroppedAt, stderrDroppedAt int64
}

// output opens the object with the fields an exec's and a shell command's results share,
// in their order.
func (r *replyWriter) output(code int, signal, stdout, stderr string, m outputMeta, timedOut bool) {
	r.raw(`{"exit_code":` + strconv.Itoa(code))
	if signal != "" {
		r.raw(`,"signal":`)
		r.str(signal)
	}
	r.raw(`,"stdout":`)
	r.str(stdout)
	r.raw(`,"stderr":`)
	r.str(stderr)
	r.flag("stdout_truncated", m.stdoutTruncated)
	r.flag("stderr_truncated", m.stderrTruncated)
	r.int("stdout_dropped", m.stdoutDropped)
	r.int("stderr_dropped", m.stderrDropped)
	r.int("stdout_dropped_at", m.stdoutDroppedAt)
	r.int("stderr_dropped_at", m.stderrDroppedAt)
	r.flag("timed_out", timedOut)
}

func (r *replyWriter) flush() error { return r.bw.Flush() }

// pieceEnd is where a piece of at most max bytes of s may end so that encoding the pieces
// one by one gives what encoding s whole gives: never inside a valid UTF-8 sequence. A
// sequence never spans a byte that is not a continuation byte (10xxxxxx), and has at most
// three of them, so backing up over at most three continuation bytes finds a boundary.
func pieceEnd(s string, max int) int {
	if len(s) <= max {
		return len(s)
	}
	n := max
	for back := 0; back < 3 && s[n]&0xC0 == 0x80; back++ {
		n--
	}
	return n
}
