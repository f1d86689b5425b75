package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at link time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

func init() {
	register("version", command{summary: "print the version", run: runVersion})
}

func runVersion(context.Context, []string) error {
	fmt.Printf("sidecar %s (%s, %s/%s", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				fmt.Printf(", commit %s", s.Value[:12])
			}
		}
	}
	fmt.Println(")")
	return nil
}
