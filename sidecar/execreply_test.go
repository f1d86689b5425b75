package sidecar

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// The streamed exec reply is byte for byte what encoding/json made of the whole result:
// invalid UTF-8, multi-byte runes across piece boundaries, HTML and line separators.
func TestWriteExecResultMatchesEncodingJSON(t *testing.T) {
	if n := reflect.TypeFor[apitype.ExecResult]().NumField(); n != 13 {
		t.Fatalf("ExecResult has %d fields: writeExecResult writes 13; teach it the new ones", n)
	}
	for i, res := range replyCases() {
		checkReply(t, i, res, func(w http.ResponseWriter) error { return writeExecResult(w, res) })
	}
}

// So is the shell command's, with its own fields.
func TestWriteShellResultMatchesEncodingJSON(t *testing.T) {
	if n := reflect.TypeFor[apitype.ShellResult]().NumField(); n != 14 {
		t.Fatalf("ShellResult has %d fields: writeShellResult writes 14; teach it the new ones", n)
	}
	for i, e := range replyCases() {
		res := apitype.ShellResult{
			ExitCode: e.ExitCode, Signal: e.Signal, Stdout: e.Stdout, Stderr: e.Stderr,
			StdoutTruncated: e.StdoutTruncated, StderrTruncated: e.StderrTruncated, TimedOut: e.TimedOut,
			StdoutDropped: e.StdoutDropped, StderrDropped: e.StderrDropped,
			StdoutDroppedAt: e.StdoutDroppedAt, StderrDroppedAt: e.StderrDroppedAt,
			Ended: e.OOMKilled, Cwd: e.Stderr[:min(len(e.Stderr), 300)], DurationMS: e.DurationMS,
		}
		checkReply(t, i, res, func(w http.ResponseWriter) error { return writeShellResult(w, res) })
	}
}

// replyCases are results whose strings are hard to encode in pieces.
func replyCases() []apitype.ExecResult {
	rnd := rand.New(rand.NewPCG(1, 2))
	random := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rnd.UintN(256))
		}
		return string(b)
	}
	// A rune of 2, 3 or 4 bytes starting at every offset around the piece boundary.
	var straddling []string
	for _, r := range []string{"é", "€", "😀"} {
		for off := replyPiece - 4; off <= replyPiece+1; off++ {
			straddling = append(straddling, strings.Repeat("a", off)+r+"tail")
		}
	}
	cases := []apitype.ExecResult{
		{},
		{ExitCode: 137, Signal: "KILL", TimedOut: true, OOMKilled: true, DurationMS: 12},
		{Stdout: "hi\n", Stderr: "err\n", StdoutTruncated: true, StderrTruncated: true,
			StdoutDropped: 1 << 40, StderrDropped: 7, StdoutDroppedAt: 1, StderrDroppedAt: 3},
		{Stdout: "<a href=\"x\">&amp;</a>\u2028\u2029\x00\x1f\t\\", Stderr: "\xff\xfe\xc3"},
		{Stdout: random(3*replyPiece + 17), Stderr: random(replyPiece)},
		{Stdout: strings.Repeat("\x80", 2*replyPiece+3), Stderr: strings.Repeat("é", replyPiece)},
	}
	for _, s := range straddling {
		cases = append(cases, apitype.ExecResult{Stdout: s, Stderr: "\xe2\x82" + s})
	}
	return cases
}

// checkReply compares what write writes with encoding/json's encoding of res.
func checkReply(t *testing.T, i int, res any, write func(http.ResponseWriter) error) {
	t.Helper()
	var want bytes.Buffer
	if err := json.NewEncoder(&want).Encode(res); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	if err := write(rec); err != nil {
		t.Fatal(err)
	}
	if got := rec.Body.Bytes(); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("case %d: streamed reply differs from encoding/json:\n got %.200q\nwant %.200q", i, got, want.Bytes())
	}
	if ct := rec.Header().Get("Content-Type"); rec.Code != 200 || ct != "application/json" {
		t.Fatalf("case %d: %d %q", i, rec.Code, ct)
	}
}
