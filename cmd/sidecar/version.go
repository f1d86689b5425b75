package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"time"
)

// version is set at link time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

func init() {
	register("version", command{summary: "print the client's version and, when a daemon is named, the daemon's",
		usage: `usage: sidecar version [-o text|json]

Prints this binary's version, then the daemon's (GET /v1/info) when one is named by --url,
--context, SANDBOX_REMOTE_URL or the current context; a named daemon that does not answer
is an error (exit 1) after the client's line.`, run: runVersion})
}

// versionInfo is `version -o json`: the client's fields, and the daemon's under "server".
type versionInfo struct {
	Version string         `json:"version"`
	Go      string         `json:"go"`
	OS      string         `json:"os"`
	Arch    string         `json:"arch"`
	Commit  string         `json:"commit"`
	Server  *serverVersion `json:"server,omitempty"`
}

type serverVersion struct {
	URL        string `json:"url"`
	Version    string `json:"version"`
	APIVersion string `json:"api_version"`
}

func runVersion(ctx context.Context, args []string) error {
	fs := newFlagSet("version")
	output := outputFlag(fs, "text", "json")
	if _, err := operands(fs, args, 0, "usage: sidecar version [-o text|json]"); err != nil {
		return err
	}
	v := versionInfo{Version: version, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v.Commit = s.Value[:12]
			}
		}
	}
	var serverErr error
	if daemonNamed() {
		v.Server, serverErr = askServerVersion(ctx)
	}
	if output.json() {
		if err := printJSON(os.Stdout, v); err != nil {
			return err
		}
		return serverErr
	}
	fmt.Printf("client: sidecar %s (%s, %s/%s", v.Version, v.Go, v.OS, v.Arch)
	if v.Commit != "" {
		fmt.Printf(", commit %s", v.Commit)
	}
	fmt.Println(")")
	if v.Server != nil {
		fmt.Printf("server: sidecar %s (API %s) at %s\n", v.Server.Version, v.Server.APIVersion, v.Server.URL)
	}
	return serverErr
}

// askServerVersion asks the named daemon for its version, for at most 10 s.
func askServerVersion(ctx context.Context) (*serverVersion, error) {
	c, err := newClient("")
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	return &serverVersion{URL: os.Getenv("SANDBOX_REMOTE_URL"), Version: info.Version, APIVersion: info.APIVersion}, nil
}
