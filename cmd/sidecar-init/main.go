// Command sidecar-init is the sandbox helper on its own: a small binary that starts much
// faster than the daemon (whose every package initialises before main). The daemon uses it
// when it sits next to the daemon's binary; build it with
//
//	make build  (go build -o bin/sidecar-init ./cmd/sidecar-init)
package main

import "github.com/sidecar-sandbox/sidecar/sidecar/sandbox/initproc"

func main() { initproc.Main() }
