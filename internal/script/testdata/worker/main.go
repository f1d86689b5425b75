// Command worker is a minimal binary that only serves scripts, for the package tests:
// they then need not build the whole daemon.
package main

import "github.com/sidecar-sandbox/sidecar/internal/script"

func main() { script.WorkerMain() }
