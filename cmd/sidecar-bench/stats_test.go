package main

import (
	"strings"
	"testing"
	"time"
)

func ms(v ...float64) samples {
	s := make(samples, len(v))
	for i, x := range v {
		s[i] = time.Duration(x * float64(time.Millisecond))
	}
	return s
}

func TestPercentile(t *testing.T) {
	tests := []struct {
		name string
		s    samples
		p    float64
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 90, 7 * time.Millisecond},
		{"odd median ignores order", ms(9, 1, 5), 50, 5 * time.Millisecond},
		{"even median interpolates", ms(4, 1, 3, 2), 50, 2500 * time.Microsecond},
		{"p0 is min", ms(3, 1, 2), 0, time.Millisecond},
		{"p100 is max", ms(3, 1, 2), 100, 3 * time.Millisecond},
		{"p10 of 11 is second", ms(10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 10, time.Millisecond},
		{"p90 interpolates", ms(0, 10), 90, 9 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.s.percentile(tt.p); got != tt.want {
				t.Errorf("percentile(%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

func TestPercentileDoesNotReorder(t *testing.T) {
	s := ms(3, 1, 2)
	_ = s.median()
	if s[0] != 3*time.Millisecond || s[1] != time.Millisecond {
		t.Fatalf("median sorted its input: %v", s)
	}
}

func TestUnitFormat(t *testing.T) {
	mb := throughput(1e9, "MB/s")
	files := throughput(10000, "files/s")
	tests := []struct {
		name string
		got  string
		want string
	}{
		{"latency ms", latency.format(1500 * time.Microsecond), "1.50 ms"},
		{"latency small", latency.format(250 * time.Microsecond), "0.25 ms"},
		{"latency large", latency.format(1234 * time.Millisecond), "1234 ms"},
		{"throughput", mb.format(2 * time.Second), "500 MB/s"},
		{"files", files.format(4 * time.Second), "2500 files/s"},
		{"tens", mb.format(80 * time.Second), "12.5 MB/s"},
		{"zero duration", mb.format(0), "∞ MB/s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %q, want %q", tt.got, tt.want)
			}
		})
	}
}

func TestRatio(t *testing.T) {
	mb := throughput(1e9, "MB/s")
	tests := []struct {
		name           string
		u              unit
		sidecar, other time.Duration
		want           string
	}{
		{"latency faster is below one", latency, time.Millisecond, 4 * time.Millisecond, "0.25×"},
		{"latency slower is above one", latency, 6 * time.Millisecond, 2 * time.Millisecond, "3.00×"},
		{"throughput faster is above one", mb, time.Second, 3 * time.Second, "3.00×"},
		{"throughput half", mb, 2 * time.Second, time.Second, "0.5×"},
		{"missing", latency, 0, time.Second, "—"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.u.ratio(tt.sidecar, tt.other); got != tt.want {
				t.Errorf("ratio = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSpreadIsLowToHigh(t *testing.T) {
	mb := throughput(1e9, "MB/s")
	// Longer times are lower throughputs: the range must still read low–high.
	if got, want := mb.spread(samples{time.Second, 2 * time.Second, 4 * time.Second}), "278–833"; got != want {
		t.Errorf("spread = %q, want %q", got, want)
	}
	if got := latency.spread(nil); got != "" {
		t.Errorf("spread of nothing = %q", got)
	}
}

func TestRenderTable(t *testing.T) {
	rows := []row{
		{name: "tree", unit: latency, sidecar: ms(1), peerName: "`tar | ssh tar`", peer: ms(2)},
		{name: "exec", unit: latency, sidecar: ms(2, 2, 2), peerName: "ssh", peer: ms(20, 20), floorName: "fork", floor: ms(1)},
		{name: "sha only", unit: throughput(1e9, "MB/s"), floorName: "sha-256", floor: samples{time.Second}},
	}
	got := renderTable(rows)
	for _, want := range []string{
		"| exec | 2.00 ms | 20.0 ms (ssh) | 1.00 ms (fork) | 2.00–2.00 · 20.0–20.0 · 1.00–1.00 | 0.1× | 2.00× |",
		"| tree | 1.00 ms | 2.00 ms (`tar \\| ssh tar`) | — |",
		"| sha only | — | — | 1000 MB/s (sha-256) | — · — · 1000–1000 | — | — |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

func TestSelectCases(t *testing.T) {
	all, err := selectCases("")
	if err != nil || len(all) != len(caseNames) {
		t.Fatalf("empty -only: %v, %v", all, err)
	}
	some, err := selectCases("exec, pty")
	if err != nil || !some["exec"] || !some["pty"] || some["load"] {
		t.Fatalf("-only exec,pty: %v, %v", some, err)
	}
	if _, err := selectCases("exec,nope"); err == nil {
		t.Fatal("an unknown case was accepted")
	}
}
