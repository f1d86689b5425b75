package main

import (
	"context"
	"fmt"
	"os"
)

func init() {
	register("cleanup", command{summary: "reap expired leases and orphaned cgroups, workdirs and processes",
		usage: "usage: sidecar cleanup [-o text|json]\n\nReaps expired leases and orphans on the daemon. Needs SANDBOX_REMOTE_URL and the shared token.",
		run:   runCleanup})
}

func runCleanup(ctx context.Context, args []string) error {
	fs := newFlagSet("cleanup")
	output := outputFlag(fs, "text", "json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("cleanup: unexpected argument %q", fs.Arg(0))
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	res, err := c.Cleanup(ctx)
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, res)
	}
	fmt.Printf("reaped %d leases, %d cgroups, %d workdirs, %d processes\n",
		len(res.Leases), len(res.Cgroups), len(res.Workdirs), len(res.Processes))
	for _, l := range res.Leases {
		fmt.Println("lease  ", l)
	}
	for _, g := range res.Cgroups {
		fmt.Println("cgroup ", g)
	}
	for _, w := range res.Workdirs {
		fmt.Println("workdir", w)
	}
	for _, p := range res.Processes {
		fmt.Println("process", p)
	}
	return nil
}
