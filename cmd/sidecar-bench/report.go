package main

import (
	"fmt"
	"strings"
)

// report renders the run as Markdown: the machine, the table, then the notes.
func (b *bench) report() string {
	var s strings.Builder
	m, after := b.machineBefore, readMachine()
	mode := "full"
	if b.quick {
		mode = "quick"
	}
	if b.http1 {
		mode += ", client forced to HTTP/1.1"
	}
	fmt.Fprintf(&s, "\n## sidecar-bench (%s run)\n\n", mode)
	fmt.Fprintf(&s, "%s · kernel %s · %d CPUs (%s) · %s memory · load average %s before, %s after · ssh cipher %s\n\n",
		m.date, m.kernel, m.nproc, m.cpu, m.memory, m.load, after.load, b.ssh.cipher)
	s.WriteString(renderTable(b.rows))
	s.WriteString("\nMedians; spread is p10–p90 of sidecar · peer · floor. Ratios are time/time for ms rows " +
		"(below 1× sidecar is faster) and throughput/throughput for rate rows (above 1× sidecar is faster).\n")
	if b.ssh.maskedRC != "" {
		fmt.Fprintf(&s, "\nsshd ran with %s masked (empty) so ssh rows measure OpenSSH, not the rc file. Cipher probe: %s.\n",
			b.ssh.maskedRC, b.ssh.cipherNote)
	}
	if len(b.notes) > 0 {
		s.WriteString("\n")
		for _, n := range b.notes {
			fmt.Fprintf(&s, "- %s\n", n)
		}
	}
	fmt.Fprintf(&s, "- daemon at the end: %s\n", b.daemonStatus)
	for _, f := range b.failures {
		fmt.Fprintf(&s, "- FAILED %s\n", f)
	}
	return s.String()
}

// renderTable is the Markdown table of rows.
func renderTable(rows []row) string {
	var s strings.Builder
	s.WriteString("| case | sidecar | peer | floor | spread (s · p · f) | sidecar/peer | sidecar/floor |\n")
	s.WriteString("|---|---:|---:|---:|---|---:|---:|\n")
	for _, r := range rows {
		cell := func(name string, x samples) string {
			if len(x) == 0 {
				return "—"
			}
			return fmt.Sprintf("%s (%s)", r.unit.format(x.median()), cellEscape(name))
		}
		spread := func(x samples) string {
			if len(x) == 0 {
				return "—"
			}
			return r.unit.spread(x)
		}
		ratio := func(x samples) string {
			if len(x) == 0 || len(r.sidecar) == 0 {
				return "—"
			}
			return r.unit.ratio(r.sidecar.median(), x.median())
		}
		side := "—"
		if len(r.sidecar) > 0 {
			side = r.unit.format(r.sidecar.median())
		}
		fmt.Fprintf(&s, "| %s | %s | %s | %s | %s · %s · %s | %s | %s |\n", cellEscape(r.name), side, cell(r.peerName, r.peer), cell(r.floorName, r.floor),
			spread(r.sidecar), spread(r.peer), spread(r.floor), ratio(r.peer), ratio(r.floor))
	}
	return s.String()
}

// cellEscape keeps a | inside a cell (even in a code span) from splitting it.
func cellEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
