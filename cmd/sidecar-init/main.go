// Command sidecar-init is the sandbox helper on its own: a small binary that starts much
// faster than the daemon (whose every package initialises before main). The daemon uses it
// when it sits next to the daemon's binary.
//
// sidecar-init.c in this directory is the same helper in C, reading the same config and
// exiting with the same codes; it starts as fast as /bin/true, where this Go build pays
// for the runtime's start on every exec. `make build` installs the C one when a C
// compiler exists and this one otherwise:
//
//	cc -O2 -static -Wall -Wextra -Werror -o bin/sidecar-init cmd/sidecar-init/sidecar-init.c
//	CGO_ENABLED=0 go build -o bin/sidecar-init ./cmd/sidecar-init
package main

import "github.com/sidecar-sandbox/sidecar/internal/confine/initproc"

func main() { initproc.Main() }
