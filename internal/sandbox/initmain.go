package sandbox

import "github.com/sidecar-sandbox/sidecar/internal/confine/initproc"

// InitMain is the helper's entry point (`sidecar __sandbox-init`): it never returns. A
// binary that wants a faster helper calls initproc.Main directly with nothing else linked.
func InitMain() { initproc.Main() }
