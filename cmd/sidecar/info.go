package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func init() {
	register("info", command{summary: "describe the daemon: version, isolation layers, limits, free capacity",
		usage: "usage: sidecar info [-o text|json]\n\nAsks the daemon (GET /v1/info) what it runs and what room it has.", run: runInfo})
}

func runInfo(ctx context.Context, args []string) error {
	fs := newFlagSet("info")
	output := outputFlag(fs, "text", "json")
	if _, err := operands(fs, args, 0, commands["info"].usage); err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, info)
	}
	return writeInfo(os.Stdout, os.Getenv("SANDBOX_REMOTE_URL"), info, time.Now())
}

// writeInfo renders GET /v1/info for a terminal.
func writeInfo(w io.Writer, url string, info apitype.Info, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	capab, capa, lim := info.Capabilities, info.Capacity, info.Limits
	yesNo := map[bool]string{true: "yes", false: "no"}
	fmt.Fprintf(tw, "daemon:\t%s\n", url)
	fmt.Fprintf(tw, "version:\t%s (API %s)\n", info.Version, info.APIVersion)
	fmt.Fprintf(tw, "isolation:\t%s\n", capab.Isolation)
	fmt.Fprintf(tw, "layers:\t%s\n", orDash(strings.Join(capab.Layers, ", ")))
	fmt.Fprintf(tw, "cgroups:\t%s; seccomp %s; landlock ABI %d; disk quota %s\n", capab.Cgroups, yesNo[capab.Seccomp], capab.Landlock, orDash(capab.DiskQuota))
	fmt.Fprintf(tw, "network:\t%s, default egress %s\n", orDash(info.Network.Isolation), orDash(info.Network.DefaultEgress))
	fmt.Fprintf(tw, "leases:\t%d active, %d free of %d\n", capa.ActiveLeases, capa.FreeLeases, lim.MaxLeases)
	fmt.Fprintf(tw, "memory:\t%s committed of %s, %s free\n", humanBytes(capa.MemoryCommittedBytes), humanBytes(capa.MemoryBytes), humanBytes(capa.MemoryHeadroomBytes))
	fmt.Fprintf(tw, "lease TTL:\t%s default, %s at most\n", time.Duration(info.DefaultTTL)*time.Second, time.Duration(lim.MaxTTLSeconds)*time.Second)
	fmt.Fprintf(tw, "draining:\t%s\n", yesNo[info.Draining])
	if info.CertNotAfter != nil {
		fmt.Fprintf(tw, "certificate:\texpires %s (%s)\n", info.CertNotAfter.Format(time.RFC3339), expiresIn(*info.CertNotAfter, now))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
