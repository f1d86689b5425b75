package apitype

import (
	"strconv"
	"unicode/utf8"
)

// OutputParts splits a stream of an ExecResult or ShellResult (Stdout with StdoutDropped
// and StdoutDroppedAt, or Stderr with its own) into the head and the tail around the
// dropped bytes. With nothing dropped, head is the whole output and tail is empty.
func OutputParts(out string, dropped, at int64) (head, tail string) {
	if dropped == 0 {
		return out, ""
	}
	i := 0
	for n := int64(0); n < at && i < len(out); n++ {
		_, size := utf8.DecodeRuneInString(out[i:])
		i += size
	}
	return out[:i], out[i:]
}

// OutputWithMarker is the output with a line saying how many bytes were dropped where
// they were: "\n[… 1048576 bytes dropped …]\n". For reading, not for parsing the output.
func OutputWithMarker(out string, dropped, at int64) string {
	if dropped == 0 {
		return out
	}
	head, tail := OutputParts(out, dropped, at)
	return head + DroppedMarker(dropped) + tail
}

// DroppedMarker is the line OutputWithMarker puts where dropped bytes were.
func DroppedMarker(dropped int64) string {
	return "\n[… " + strconv.FormatInt(dropped, 10) + " bytes dropped …]\n"
}
