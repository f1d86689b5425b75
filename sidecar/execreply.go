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
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriterSize(w, 32<<10)
	var scratch bytes.Buffer
	enc := json.NewEncoder(&scratch) // escapes HTML, as writeJSON's encoder does
	str := func(s string) {
		_ = bw.WriteByte('"')
		for len(s) > 0 {
			n := pieceEnd(s, replyPiece)
			scratch.Reset()
			_ = enc.Encode(s[:n]) // a string always encodes: "…"\n
			q := scratch.Bytes()
			_, _ = bw.Write(q[1 : len(q)-2])
			s = s[n:]
		}
		_ = bw.WriteByte('"')
	}
	flag := func(name string, v bool) {
		_, _ = bw.WriteString(`,"` + name + `":` + strconv.FormatBool(v))
	}
	_, _ = bw.WriteString(`{"exit_code":` + strconv.Itoa(res.ExitCode))
	if res.Signal != "" {
		_, _ = bw.WriteString(`,"signal":`)
		str(res.Signal)
	}
	_, _ = bw.WriteString(`,"stdout":`)
	str(res.Stdout)
	_, _ = bw.WriteString(`,"stderr":`)
	str(res.Stderr)
	flag("stdout_truncated", res.StdoutTruncated)
	flag("stderr_truncated", res.StderrTruncated)
	flag("timed_out", res.TimedOut)
	flag("oom_killed", res.OOMKilled)
	_, _ = bw.WriteString(`,"duration_ms":` + strconv.FormatInt(res.DurationMS, 10) + "}\n")
	return bw.Flush() // the first write error sticks in bw and comes out here
}

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
