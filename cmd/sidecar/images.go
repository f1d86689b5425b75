package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func init() {
	register("images", command{summary: "the operator's lease images (ls, pull NAME, rm NAME)",
		usage: imagesUsage, subs: []string{"ls", "pull", "rm"}, run: runImages})
}

const imagesUsage = `usage: sidecar images ls [-o table|json]
       sidecar images pull NAME [-o text|json]   pull again in the background (progress in ls)
       sidecar images rm NAME                    remove from the store (refused while leases use it)

The images are the daemon's SIDECAR_IMAGES and the snapshots of leases (sidecar leases
snapshot ID NAME); a lease names one with sidecar leases new SESSION --image NAME.
Needs SANDBOX_REMOTE_URL and the shared token (SANDBOX_REMOTE_AUTH_TOKEN or _FILE).`

func runImages(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, imagesUsage)
		return usageError{}
	}
	switch args[0] {
	case "ls", "list":
		return imagesList(ctx, args[1:])
	case "pull":
		return imagesPull(ctx, args[1:])
	case "rm", "remove":
		return imagesRemove(ctx, args[1:])
	default:
		fmt.Fprintln(os.Stderr, imagesUsage)
		return usagef("images: unknown subcommand %q", args[0])
	}
}

func imagesList(ctx context.Context, args []string) error {
	fs := newFlagSet("images ls", "usage: sidecar images ls [-o table|json]\n\nThe daemon's images (SIDECAR_IMAGES): state, size, leases on each, and whether those run as root (SIDECAR_ROOT_IMAGES).")
	output := outputFlag(fs, "table", "json")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("images ls: unexpected argument %q", fs.Arg(0))
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	list, err := c.ListImages(ctx)
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, list)
	}
	return writeImageTable(os.Stdout, list)
}

// imageName is the one NAME argument of pull and rm.
func imageName(fs *flag.FlagSet, args []string) (string, error) {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 || pos[0] == "" {
		return "", usagef("usage: sidecar %s NAME", fs.Name())
	}
	return pos[0], nil
}

func imagesPull(ctx context.Context, args []string) error {
	fs := newFlagSet("images pull", "usage: sidecar images pull NAME [-o text|json]\n\nPulls NAME again in the background (a moved tag); sidecar images ls shows the progress.")
	output := outputFlag(fs, "text", "json")
	name, err := imageName(fs, args)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	in, err := c.PullImage(ctx, name)
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, in)
	}
	fmt.Printf("%s: %s (sidecar images ls shows the progress)\n", in.Name, in.State)
	return nil
}

func imagesRemove(ctx context.Context, args []string) error {
	fs := newFlagSet("images rm", "usage: sidecar images rm NAME\n\nRemoves NAME from the store (refused while leases use it); it stays listed as absent.")
	name, err := imageName(fs, args)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	return c.RemoveImage(ctx, name)
}

// writeImageTable renders GET /v1/images for a terminal.
func writeImageTable(w io.Writer, list apitype.ImageList) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tSIZE\tLEASES\tROOT\tDIGEST\tREF")
	for _, in := range list.Images {
		state := in.State
		switch in.State {
		case apitype.ImagePulling:
			state = fmt.Sprintf("pulling %.0f%%", in.Progress*100)
		case apitype.ImageFailed:
			state = "failed: " + in.Error
		}
		ref := in.Ref
		if in.Snapshot != nil {
			ref = fmt.Sprintf("snapshot of %s on %s", in.Snapshot.Lease, in.Snapshot.Base)
		}
		digest := in.Digest
		if len(digest) > 19 {
			digest = digest[:19] // sha256: and 12 hex digits, as docker shows them
		}
		if digest == "" {
			digest = "-"
		}
		root := "-" // SIDECAR_ROOT_IMAGES: its leases run as root
		if in.Root {
			root = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", in.Name, state, humanBytes(in.SizeBytes), in.InUse, root, digest, ref)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "default: %s; store %s of %s\n", list.DefaultImage, humanBytes(list.UsedBytes), humanBytes(list.LimitBytes))
	return err
}
