package main

import (
	"context"
	"flag"
	"fmt"
	"os"
)

func init() {
	register("cleanup", command{summary: "reap expired leases and orphaned cgroups, workdirs and processes", run: runCleanup})
}

func runCleanup(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cleanup", flag.ContinueOnError)
	output := fs.String("o", "text", "output format: text or json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	res, err := c.Cleanup(ctx)
	if err != nil {
		return err
	}
	if *output == "json" {
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
