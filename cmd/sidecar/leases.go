package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func init() {
	register("leases", command{summary: "list, show, create and release leases (ls, show ID, new SESSION, rm ID..., network ID, leftovers ID, kill ID PID, snapshot ID NAME)",
		usage: leasesUsage, subs: []string{"ls", "show", "rm", "new", "network", "leftovers", "kill", "snapshot"}, run: runLeases})
}

const leasesUsage = `usage: sidecar leases ls [--session S] [--label k=v]... [-q] [-o table|json]
       sidecar leases show ID [-o json]
       sidecar leases rm ID...
       sidecar leases new SESSION_ID [--ttl 1h] [--image NAME] [--network none|allowlist|internet]
                         [--allow-out X]... [--deny-out X]... [--label k=v]... [-o text|json]
       sidecar leases network ID --network none|allowlist|internet [--allow-out X]... [--deny-out X]...
                                                 replace a lease's network policy (new connections)
       sidecar leases leftovers ID [-o table|json]   what finished commands left running
       sidecar leases kill ID PID [--signal TERM]    signal one of them (only a leftover of ID)
       sidecar leases snapshot ID NAME [-o text|json] save the lease's root, workspace and home
                                                 as the image NAME (new leases: --image NAME)

--allow-out and --deny-out take IPv4/IPv6 addresses or CIDRs ("10.1.0.0/16",
"[2001:db8::/32]:443") and domain names ("pypi.org", "*.pythonhosted.org"), each with an
optional :port; repeat the flag or separate entries with commas. --allow-out alone means
--network allowlist, --deny-out alone --network internet. Loopback, this host, other
leases, private ranges, cloud metadata and port 25 stay closed under every policy.

Needs SANDBOX_REMOTE_URL and the shared token (SANDBOX_REMOTE_AUTH_TOKEN or _FILE).`

func runLeases(ctx context.Context, args []string) error {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, leasesUsage)
		return usageError{}
	}
	switch args[0] {
	case "ls", "list":
		return leasesList(ctx, args[1:])
	case "show", "get":
		return leasesShow(ctx, args[1:])
	case "rm", "release":
		return leasesRemove(ctx, args[1:])
	case "new", "acquire":
		return leasesNew(ctx, args[1:])
	case "network":
		return leasesNetwork(ctx, args[1:])
	case "leftovers":
		return leasesLeftovers(ctx, args[1:])
	case "kill":
		return leasesKill(ctx, args[1:])
	case "snapshot", "commit":
		return leasesSnapshot(ctx, args[1:])
	default:
		fmt.Fprintln(os.Stderr, leasesUsage)
		return usagef("leases: unknown subcommand %q", args[0])
	}
}

func leasesList(ctx context.Context, args []string) error {
	fs := newFlagSet("leases ls", "usage: sidecar leases ls [--session S] [--label k=v]... [-q] [-o table|json]")
	output := outputFlag(fs, "table", "json")
	session := fs.String("session", "", "`ID` only the leases of this session")
	var labels multiFlag
	fs.Var(&labels, "label", "`K=V` only leases with this label (repeatable: all of them)")
	quiet := fs.Bool("q", false, "print the lease ids only, one a line")
	if _, err := operands(fs, args, 0, "usage: sidecar leases ls [--session S] [--label k=v]... [-q] [-o table|json]"); err != nil {
		return err
	}
	want, err := keyValues(labels, "--label")
	if err != nil {
		return usageError{err.Error()}
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	all, err := c.List(ctx)
	if err != nil {
		return err
	}
	leases := filterLeases(all, *session, want)
	if *quiet {
		for _, l := range leases {
			fmt.Println(l.ID)
		}
		return nil
	}
	if output.json() {
		return printJSON(os.Stdout, apitype.LeaseList{Leases: leases})
	}
	return writeLeaseTable(os.Stdout, leases, time.Now())
}

// filterLeases keeps the leases of session (any, when empty) that carry every label of
// labels.
func filterLeases(leases []apitype.Lease, session string, labels map[string]string) []apitype.Lease {
	out := make([]apitype.Lease, 0, len(leases))
	for _, l := range leases {
		if session != "" && l.SessionID != session {
			continue
		}
		match := true
		for k, v := range labels {
			if got, ok := l.Labels[k]; !ok || got != v {
				match = false
			}
		}
		if match {
			out = append(out, l)
		}
	}
	return out
}

// oneID parses a subcommand that takes exactly one lease id; formats, when given, are
// its -o choices.
func oneID(name string, args []string, formats ...string) (string, error) {
	fs := newFlagSet(name, "usage: sidecar "+name+" ID")
	if len(formats) > 0 {
		outputFlag(fs, formats...)
	}
	pos, err := operands(fs, args, 1, "usage: sidecar "+name+" ID")
	if err != nil {
		return "", err
	}
	return pos[0], nil
}

func leasesShow(ctx context.Context, args []string) error {
	id, err := oneID("leases show", args, "json")
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	l, err := c.Get(ctx, id)
	if err != nil {
		return err
	}
	return printJSON(os.Stdout, l)
}

func leasesLeftovers(ctx context.Context, args []string) error {
	fs := newFlagSet("leases leftovers", "usage: sidecar leases leftovers ID [-o table|json]\n\nWhat finished commands left running in the lease.")
	output := outputFlag(fs, "table", "json")
	pos, err := operands(fs, args, 1, "usage: sidecar leases leftovers ID [-o table|json]")
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	l, err := c.Get(ctx, pos[0])
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, struct {
			Count     int                `json:"leftover_count"`
			Leftovers []apitype.Leftover `json:"leftovers"`
		}{l.LeftoverCount, append([]apitype.Leftover{}, l.Leftovers...)})
	}
	return writeLeftovers(os.Stdout, l, time.Now())
}

func leasesKill(ctx context.Context, args []string) error {
	fs := newFlagSet("leases kill", "usage: sidecar leases kill ID PID [--signal TERM]\n\nSignals one of the lease's leftovers (sidecar leases leftovers ID).")
	sig := fs.String("signal", "TERM", "signal name (TERM, KILL, INT, …)")
	pos, err := operands(fs, args, 2, "usage: sidecar leases kill ID PID [--signal TERM]")
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(pos[1])
	if err != nil || pid <= 0 {
		return usagef("leases kill: PID must be a positive number, not %q", pos[1])
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	return c.OpenLease(pos[0], "").SignalLeftover(ctx, pid, *sig)
}

func leasesSnapshot(ctx context.Context, args []string) error {
	const usage = "usage: sidecar leases snapshot ID NAME [-o text|json]"
	fs := newFlagSet("leases snapshot", usage+"\n\nSaves what the lease wrote into its image's root (packages installed), its workspace and its home\nas the image NAME; sidecar leases new SESSION --image NAME starts leases from it, sidecar images rm NAME\nremoves it. The lease keeps running.")
	output := outputFlag(fs, "text", "json")
	pos, err := operands(fs, args, 2, usage)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	in, err := c.OpenLease(pos[0], "").Snapshot(ctx, pos[1])
	if err != nil {
		return err
	}
	if output.json() {
		return printJSON(os.Stdout, in)
	}
	fmt.Printf("%s: %s, %s, on %s (sidecar leases new SESSION --image %s)\n", in.Name, in.State, humanBytes(in.SizeBytes), in.Snapshot.Base, in.Name)
	return nil
}

func leasesRemove(ctx context.Context, args []string) error {
	const usage = "usage: sidecar leases rm ID..."
	fs := newFlagSet("leases rm", usage+"\n\nReleases each lease (its processes killed, its workdir removed); exit 1 if any failed.")
	ids, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return usageError{usage}
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	failed := 0
	for _, id := range ids {
		if err := c.Release(ctx, id); err != nil {
			fmt.Fprintln(os.Stderr, errorLine(fmt.Errorf("%s: %w", id, err)))
			failed++
			continue
		}
		fmt.Println(id)
	}
	if failed > 0 {
		return exitError{exitFailure}
	}
	return nil
}

const newLeaseUsage = `usage: sidecar leases new SESSION_ID [--ttl 1h] [--image NAME] [--network none|allowlist|internet]
                         [--allow-out X]... [--deny-out X]... [--label k=v]... [-o text|json]

Acquires the lease of SESSION_ID: a new one, or the session's active lease (then --ttl
renews it to that TTL, and a note on stderr says which lease was reused).`

// newLeaseArgs are the parsed arguments of `leases new`.
type newLeaseArgs struct {
	req    apitype.AcquireRequest
	output string
}

func parseNewLease(args []string) (newLeaseArgs, error) {
	fs := newFlagSet("leases new", newLeaseUsage)
	ttl := fs.Duration("ttl", 0, "lease TTL (0: the daemon's default)")
	image := fs.String("image", "", "the image the lease runs on (sidecar images ls; host: the host's root; empty: the daemon's default)")
	pf := addPolicyFlags(fs)
	output := outputFlag(fs, "text", "json")
	var labels multiFlag
	fs.Var(&labels, "label", "`K=V` label (repeatable)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return newLeaseArgs{}, err
	}
	if len(pos) != 1 || pos[0] == "" {
		return newLeaseArgs{}, usageError{newLeaseUsage}
	}
	if *ttl < 0 || *ttl%time.Second != 0 {
		return newLeaseArgs{}, usagef("--ttl %v: want a positive whole number of seconds", *ttl)
	}
	network, err := pf.policy()
	if err != nil {
		return newLeaseArgs{}, err
	}
	lbl, err := keyValues(labels, "--label")
	if err != nil {
		return newLeaseArgs{}, usageError{err.Error()}
	}
	return newLeaseArgs{
		req:    apitype.AcquireRequest{SessionID: pos[0], TTLSeconds: int64(*ttl / time.Second), Network: network, Labels: lbl, Image: *image},
		output: output.value,
	}, nil
}

func leasesNew(ctx context.Context, args []string) error {
	a, err := parseNewLease(args)
	if err != nil {
		return err
	}
	c, err := newClient("")
	if err != nil {
		return err
	}
	// The daemon answers an active session's lease unchanged: look for one first, to
	// apply --ttl to it and to say that nothing else was.
	all, err := c.List(ctx)
	if err != nil {
		return err
	}
	existing := filterLeases(all, a.req.SessionID, nil)
	// The lease lives on until its TTL; nothing renews it after this command.
	l, err := c.Acquire(ctx, a.req)
	if err != nil {
		return err
	}
	l.StopRenewing()
	info := l.Info()
	if len(existing) > 0 && existing[0].ID == info.ID {
		if info, err = reuseNote(a, info, func(ttl time.Duration) (apitype.Lease, error) { return c.Renew(ctx, info.ID, ttl) }); err != nil {
			return err
		}
	}
	if a.output == "json" {
		return printJSON(os.Stdout, info)
	}
	fmt.Printf("id:      %s\ntoken:   %s\nexpires: %s\nnetwork: %s\n", info.ID, info.Token, info.ExpiresAt.Format(time.RFC3339), policyText(info.Network))
	return nil
}

// reuseNote tells stderr that the session's active lease was returned, renews it to
// --ttl when given (the acquire applied nothing), and names the options not applied.
func reuseNote(a newLeaseArgs, info apitype.Lease, renew func(time.Duration) (apitype.Lease, error)) (apitype.Lease, error) {
	note := fmt.Sprintf("sidecar: session %s already has lease %s", a.req.SessionID, info.ID)
	if a.req.TTLSeconds > 0 {
		renewed, err := renew(time.Duration(a.req.TTLSeconds) * time.Second)
		if err != nil {
			return info, fmt.Errorf("session %s already has lease %s; renewing it to --ttl: %w", a.req.SessionID, info.ID, err)
		}
		token := info.Token
		info = renewed
		if info.Token == "" {
			info.Token = token
		}
		note += fmt.Sprintf("; --ttl applied: it now expires %s", info.ExpiresAt.Local().Format(time.RFC3339))
	}
	var ignored []string
	if a.req.Network != nil {
		ignored = append(ignored, "--network/--allow-out/--deny-out (sidecar leases network changes it)")
	}
	if len(a.req.Labels) > 0 {
		ignored = append(ignored, "--label")
	}
	if a.req.Image != "" && a.req.Image != info.Image {
		ignored = append(ignored, "--image (the lease runs on "+info.Image+")")
	}
	if len(ignored) > 0 {
		note += "; not applied to it: " + strings.Join(ignored, ", ")
	}
	fmt.Fprintln(os.Stderr, note)
	return info, nil
}

// writeLeaseTable renders the lease inspection list for a terminal.
func writeLeaseTable(w io.Writer, leases []apitype.Lease, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSESSION\tSTATE\tEXPIRES\tPROCS\tLEFT\tMEM\tCPU\tDISK\tEGRESS\tSENT\tRECV")
	for _, l := range leases {
		mem, cpu, disk := "-", "-", "-"
		if u := l.Usage; u != nil {
			mem = usageOf(u.MemoryBytes, l.Limits.MemoryBytes)
			cpu = fmt.Sprintf("%.1fs", u.CPUSeconds)
			disk = usageOf(u.DiskBytes, l.Limits.DiskBytes)
		}
		sent, recv := "-", "-" // no stats: the lease shares the host's network
		if st := l.NetworkStats; st != nil {
			sent, recv = humanBytes(st.BytesSent), humanBytes(st.BytesReceived)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n",
			l.ID, l.SessionID, l.State, expiresIn(l.ExpiresAt, now), l.Processes, l.LeftoverCount, mem, cpu, disk,
			egressOf(l.Network), sent, recv)
	}
	return tw.Flush()
}

// egressOf is the policy's mode with the number of its rules: "allowlist+3".
func egressOf(p apitype.NetworkPolicy) string {
	if p.Egress == "" {
		return "-"
	}
	if n := len(p.AllowOut) + len(p.DenyOut); n > 0 {
		return fmt.Sprintf("%s+%d", p.Egress, n)
	}
	return p.Egress
}

// writeLeftovers renders a lease's leftover processes for a terminal.
func writeLeftovers(w io.Writer, l apitype.Lease, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tSTARTED\tRSS\tCOMMAND")
	for _, p := range l.Leftovers {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", p.PID, strings.TrimPrefix(expiresIn(p.StartedAt, now), "in "),
			humanBytes(p.RSSBytes), strings.Join(p.Argv, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n := l.LeftoverCount - len(l.Leftovers); n > 0 {
		_, err := fmt.Fprintf(w, "(%d more not listed)\n", n)
		return err
	}
	return nil
}

// usageOf is "used/limit", or just "used" without a limit.
func usageOf(used, limit int64) string {
	if limit <= 0 {
		return humanBytes(used)
	}
	return humanBytes(used) + "/" + humanBytes(limit)
}

// expiresIn is a short relative time: "in 14m3s", or "3s ago" once past.
func expiresIn(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now).Round(time.Second)
	if d < 0 {
		return strings.TrimPrefix((-d).String(), "-") + " ago"
	}
	return "in " + d.String()
}
