package shell

import (
	"bytes"
	"crypto/rand"
	"strings"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
	"github.com/sidecar-sandbox/sidecar/internal/process"
)

// The framing between the daemon and a shell. Every command goes to the shell's stdin as
//
//	{ command eval 'CMD'
//	} </dev/null; printf '%s%s:%s%s' N "$?" "$PWD" N >&8; printf '%s' N >&9
//
// where N is a nonce drawn for this command only, and fds 8 and 9 are the shell's own
// stdout and stderr, saved at start (so a command's `exec >file` does not swallow the
// markers). Everything a stream carries before the first N is the command's output, byte
// for byte (no newline added or removed); on stdout, what follows up to the second N is
// "exit code:cwd". The nonce exists only in the text the shell read from its stdin, which
// no command can read (its stdin is /dev/null): output that merely looks like a marker
// cannot end a command. `command eval` keeps a syntax error from exiting a POSIX sh (eval
// is a special built-in there).

// newNonce is 130 random bits, as 26 base32 letters and digits: no shell quoting needed.
func newNonce() string { return "SC" + rand.Text() }

// quote makes s one single-quoted shell word.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// commandScript is what the shell reads for one command.
func commandScript(cmd, nonce string) string {
	return "{ command eval " + quote(cmd) + "\n} </dev/null; " + trailerScript(nonce, `"$?"`, `"$PWD"`)
}

// trailerScript prints the end markers: on stdout N<a>:<b>N, on stderr N.
func trailerScript(nonce, a, b string) string {
	return "printf '%s%s:%s%s' " + nonce + " " + a + " " + b + " " + nonce + " >&8; printf '%s' " + nonce + " >&9\n"
}

// initScript prepares a new shell: INT is trapped so that the interrupt meant for a
// command does not end the shell (a trapped signal is reset to the default in children,
// so the command still gets it), fds 8 and 9 keep the framing's streams, and the first
// trailer reports the shell's pid and whether it is bash.
func initScript(nonce string) string {
	return "trap ':' INT\nexec 8>&1 9>&2\n" + trailerScript(nonce, `"$$"`, `"${BASH_VERSION:+bash}"`)
}

// maxTrailer bounds "exit code:cwd" (a cwd is at most PATH_MAX, 4096).
const maxTrailer = 8 << 10

// stream collects one channel of one command: its output up to the first marker, into out
// (which keeps what the limit and the daemon's output budget allow, the rest dropped and
// flagged; nil drops it all), and, on stdout, the trailer up to the second.
type stream struct {
	marker      []byte
	out         *process.Capture
	channel     byte
	wantTrailer bool

	pending []byte // the tail that may be the start of a marker split across chunks
	found   bool   // the first marker was seen
	trailer []byte
	done    bool
}

func newStream(nonce string, out *process.Capture, channel byte) *stream {
	return &stream{marker: []byte(nonce), out: out, channel: channel, wantTrailer: channel == apitype.ChannelStdout}
}

// feed takes the next bytes of the channel (p is shared: never modified or kept).
func (s *stream) feed(p []byte) {
	if s.done {
		return // after the command ended: a background job's, dropped
	}
	if !s.found {
		buf := append(s.pending, p...)
		i := bytes.Index(buf, s.marker)
		if i < 0 {
			cut := max(0, len(buf)-(len(s.marker)-1))
			s.keep(buf[:cut])
			s.pending = append(s.pending[:0:0], buf[cut:]...)
			return
		}
		s.keep(buf[:i])
		s.found, s.pending = true, nil
		if !s.wantTrailer {
			s.done = true
			return
		}
		p = buf[i+len(s.marker):]
	}
	s.trailer = append(s.trailer, p...)
	if i := bytes.Index(s.trailer, s.marker); i >= 0 {
		s.trailer, s.done = s.trailer[:i], true
	} else if len(s.trailer) > maxTrailer {
		s.trailer, s.done = nil, true // cannot happen with our script; never grow without bound
	}
}

func (s *stream) keep(p []byte) {
	if s.out != nil && len(p) > 0 {
		s.out.Write(s.channel, p)
	}
}

// flush ends a stream whose marker never came (the shell ended): what may have been a
// marker's start is output after all.
func (s *stream) flush() {
	if !s.found {
		s.keep(s.pending)
		s.pending = nil
	}
}
