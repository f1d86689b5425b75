package script

import "strings"

// logSink collects what the script writes to stdout/stderr (console.log) as lines,
// keeping at most maxBytes bytes and maxLines lines; the rest is counted, not kept.
type logSink struct {
	maxBytes, maxLines int
	kept               int // bytes kept so far
	done               []string
	partial            strings.Builder
	dropped            bool
}

func (s *logSink) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if s.full() {
			s.dropped = true
			return n, nil
		}
		line, rest, nl := strings.Cut(string(p), "\n")
		room := s.maxBytes - s.kept
		if len(line) > room {
			line, nl, s.dropped = line[:room], true, true
		}
		s.partial.WriteString(line)
		s.kept += len(line)
		if nl {
			s.done = append(s.done, s.partial.String())
			s.partial.Reset()
		}
		p = []byte(rest)
		if !nl {
			break
		}
	}
	return n, nil
}

func (s *logSink) full() bool { return s.kept >= s.maxBytes || len(s.done) >= s.maxLines }

// lines returns the collected lines, with a marker when some output was dropped.
func (s *logSink) lines() []string {
	out := s.done
	if s.partial.Len() > 0 && len(out) < s.maxLines {
		out = append(out, s.partial.String())
	}
	if s.dropped {
		out = append(out, "[sidecar: further log output dropped]")
	}
	return out
}
