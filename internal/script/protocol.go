package script

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// The daemon and a worker exchange frames: a 4-byte big-endian length, then that many
// bytes of JSON. The daemon sends one setup frame, the worker answers ready; then each
// job frame gets exactly one reply frame.

// setup is the first frame a worker reads.
type setup struct {
	Root           string `json:"root"`      // empty read-only dir used as the WASI root
	CacheDir       string `json:"cache_dir"` // wazero compilation cache
	MemoryBytes    int64  `json:"memory_bytes"`
	MaxResultBytes int    `json:"max_result_bytes"`
	MaxLogBytes    int    `json:"max_log_bytes"`
	MaxLogLines    int    `json:"max_log_lines"`
	GoMemoryLimit  int64  `json:"go_memory_limit"`      // debug.SetMemoryLimit for the worker
	DataLimit      int64  `json:"data_limit,omitempty"` // RLIMIT_DATA when there is no cgroup
	Landlock       int    `json:"landlock,omitempty"`   // set by the worker: ABI it applied
	Seccomp        bool   `json:"seccomp,omitempty"`    // install package seccomp's filter
}

// job is one script to run.
type job struct {
	Source      string          `json:"source"`
	Input       json.RawMessage `json:"input"`
	MemoryBytes int64           `json:"memory_bytes"`
}

// reply answers setup (Ready) or a job.
type reply struct {
	Ready    bool            `json:"ready,omitempty"`
	Landlock int             `json:"landlock,omitempty"` // with Ready: the Landlock ABI in force, 0 none
	Result   json.RawMessage `json:"result,omitempty"`
	Logs     []string        `json:"logs,omitempty"`
	Error    *Error          `json:"error,omitempty"`
	Nanos    int64           `json:"nanos,omitempty"`
	Unusable bool            `json:"unusable,omitempty"` // the worker exits after this reply
}

var errFrameTooLarge = errors.New("script: frame too large")

func writeFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 4, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// readFrame reads one frame of at most limit bytes into v.
func readFrame(r io.Reader, limit int, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if int64(n) > int64(limit) {
		return fmt.Errorf("%w: %d > %d bytes", errFrameTooLarge, n, limit)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
