package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
)

// version is set at link time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

func init() {
	register("version", command{summary: "print the version", usage: "usage: sidecar version [-o text|json]", run: runVersion})
}

func runVersion(_ context.Context, args []string) error {
	fs := newFlagSet("version")
	output := outputFlag(fs, "text", "json")
	if _, err := operands(fs, args, 0, "usage: sidecar version [-o text|json]"); err != nil {
		return err
	}
	commit := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				commit = s.Value[:12]
			}
		}
	}
	if output.json() {
		return printJSON(os.Stdout, map[string]string{"version": version, "go": runtime.Version(),
			"os": runtime.GOOS, "arch": runtime.GOARCH, "commit": commit})
	}
	fmt.Printf("sidecar %s (%s, %s/%s", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if commit != "" {
		fmt.Printf(", commit %s", commit)
	}
	fmt.Println(")")
	return nil
}
