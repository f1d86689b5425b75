package main

import (
	"bytes"
	"errors"
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

func TestParseExec(t *testing.T) {
	tests := []struct {
		args    []string
		want    execArgs
		wantErr bool
	}{
		{args: []string{"L1", "--", "ls", "-l"}, want: execArgs{lossless: true, lease: "L1", argv: []string{"ls", "-l"}}},
		{args: []string{"L1", "ls", "-l"}, want: execArgs{lossless: true, lease: "L1", argv: []string{"ls", "-l"}}},
		{args: []string{"-i", "-t", "--cwd", "src", "--env", "A=1", "--env", "B=x=y", "--timeout", "5s", "L1", "--", "sh", "-c", "echo --"},
			want: execArgs{lossless: true, interactive: true, tty: true, cwd: "src", env: map[string]string{"A": "1", "B": "x=y"},
				timeout: 5 * time.Second, lease: "L1", argv: []string{"sh", "-c", "echo --"}}},
		{args: []string{"--lossless=false", "-d", "L1", "make"}, want: execArgs{detach: true, lease: "L1", argv: []string{"make"}}},
		// docker's habits: bundled flags, flags after LEASE up to the command.
		{args: []string{"-it", "L1", "sh"}, want: execArgs{lossless: true, interactive: true, tty: true, lease: "L1", argv: []string{"sh"}}},
		{args: []string{"L1", "-ti", "--cwd", "d", "--", "sh", "-c", "x"},
			want: execArgs{lossless: true, interactive: true, tty: true, cwd: "d", lease: "L1", argv: []string{"sh", "-c", "x"}}},
		{args: []string{"L1", "-t", "ls", "-i"}, want: execArgs{lossless: true, tty: true, lease: "L1", argv: []string{"ls", "-i"}}},
		{args: []string{"-i", "L1", "--", "-weird"}, want: execArgs{lossless: true, interactive: true, lease: "L1", argv: []string{"-weird"}}},
		{args: []string{"-ix", "L1", "true"}, wantErr: true},
		{args: []string{"L1", "-t"}, wantErr: true},
		{args: []string{"L1"}, wantErr: true},
		{args: []string{"L1", "--"}, wantErr: true},
		{args: []string{"--env", "NOEQUALS", "L1", "true"}, wantErr: true},
		{args: []string{"--timeout", "-1s", "L1", "true"}, wantErr: true},
		{args: []string{"--bogus", "L1", "true"}, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseExec(tt.args)
		if (err != nil) != tt.wantErr {
			t.Errorf("%q: err = %v", tt.args, err)
			continue
		}
		if !tt.wantErr && !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%q:\n got %+v\nwant %+v", tt.args, got, tt.want)
		}
	}
}

func TestParseNewLease(t *testing.T) {
	got, err := parseNewLease([]string{"sess-1", "--ttl", "1h", "--network", "none", "--label", "team=ml", "--label", "env=dev", "-o", "json"})
	if err != nil {
		t.Fatal(err)
	}
	want := newLeaseArgs{output: "json", req: apitype.AcquireRequest{SessionID: "sess-1", TTLSeconds: 3600,
		Network: &apitype.NetworkPolicy{Egress: "none"}, Labels: map[string]string{"team": "ml", "env": "dev"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v", got)
	}
	for _, bad := range [][]string{
		{}, {"a", "b"}, {"s", "--ttl", "1.5s"}, {"s", "--network", "bridge"}, {"s", "--network", "host"},
		{"s", "--label", "x"}, {"s", "-o", "yaml"},
	} {
		if _, err := parseNewLease(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The network flags: repeatable and comma-separated entries, the mode inferred from a
// lone --allow-out or --deny-out, no flag at all leaving the daemon's default.
func TestParseNetworkFlags(t *testing.T) {
	tests := []struct {
		args []string
		want *apitype.NetworkPolicy
	}{
		{[]string{"s"}, nil},
		{[]string{"s", "--network", "internet"}, &apitype.NetworkPolicy{Egress: "internet"}},
		{[]string{"s", "--allow-out", "pypi.org,*.pythonhosted.org:443", "--allow-out", "[2001:db8::/32]:443"},
			&apitype.NetworkPolicy{Egress: "allowlist", AllowOut: []string{"pypi.org", "*.pythonhosted.org:443", "[2001:db8::/32]:443"}}},
		{[]string{"s", "--deny-out", "203.0.113.0/24, example.com"},
			&apitype.NetworkPolicy{Egress: "internet", DenyOut: []string{"203.0.113.0/24", "example.com"}}},
		{[]string{"--network", "internet", "s", "--deny-out", "*.example.com", "--allow-out", "api.example.com:443"},
			&apitype.NetworkPolicy{Egress: "internet", AllowOut: []string{"api.example.com:443"}, DenyOut: []string{"*.example.com"}}},
	}
	for _, tt := range tests {
		got, err := parseNewLease(tt.args)
		if err != nil {
			t.Errorf("%q: %v", tt.args, err)
			continue
		}
		if !reflect.DeepEqual(got.req.Network, tt.want) {
			t.Errorf("%q: network %+v, want %+v", tt.args, got.req.Network, tt.want)
		}
	}
	for _, bad := range [][]string{
		{"s", "--allow-out", "a.com", "--deny-out", "b.com"}, // which mode? --network must say
		{"s", "--network", "none", "--allow-out", "a.com"},
		{"s", "--allow-out", "a.com,,b.com"},
		{"s", "--deny-out", ""},
	} {
		_, err := parseNewLease(bad)
		if !isUsageError(err) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}

	a, err := parseLeasesNetwork([]string{"L1", "--network", "allowlist", "--allow-out", "10.1.2.3:5432", "-o", "json"})
	if err != nil {
		t.Fatal(err)
	}
	want := networkArgs{lease: "L1", output: "json", policy: apitype.NetworkPolicy{Egress: "allowlist", AllowOut: []string{"10.1.2.3:5432"}}}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("leases network: %+v, want %+v", a, want)
	}
	for _, bad := range [][]string{{"L1"}, {"--network", "none"}, {"L1", "L2", "--network", "none"}, {"L1", "--network", "bridge"}} {
		if _, err := parseLeasesNetwork(bad); !isUsageError(err) {
			t.Errorf("leases network %q: %v, want a usage error", bad, err)
		}
	}
}

func TestRemoteArg(t *testing.T) {
	tests := []struct {
		arg, lease, path string
		ok               bool
	}{
		{"L1:src/main.go", "L1", "src/main.go", true},
		{"L1:", "L1", ".", true},
		{"L1:/abs", "L1", "/abs", true},
		{"./a:b", "", "", false},
		{"dir/a:b", "", "", false},
		{":x", "", "", false},
		{"plain.txt", "", "", false},
	}
	for _, tt := range tests {
		lease, p, ok := remoteArg(tt.arg)
		if lease != tt.lease || p != tt.path || ok != tt.ok {
			t.Errorf("remoteArg(%q) = %q, %q, %v", tt.arg, lease, p, ok)
		}
	}
}

func TestParseCp(t *testing.T) {
	up, err := parseCp([]string{"-z", "./build", "L1:out/"})
	if err != nil || !up.upload || up.lease != "L1" || up.remote != "out/" || up.local != "./build" || !up.compress {
		t.Fatalf("upload: %+v %v", up, err)
	}
	down, err := parseCp([]string{"L1:logs", "."})
	if err != nil || down.upload || down.remote != "logs" || down.local != "." {
		t.Fatalf("download: %+v %v", down, err)
	}
	for _, bad := range [][]string{{"a", "b"}, {"L1:a", "L2:b"}, {"only"}} {
		if _, err := parseCp(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseScript(t *testing.T) {
	a, err := parseScript([]string{"run", "f.js", "--input", "in.json", "--lease-token", "tok", "--timeout", "2s"})
	if err != nil || a.file != "f.js" || a.input != "in.json" || a.leaseToken != "tok" || a.timeout != 2*time.Second {
		t.Fatalf("%+v %v", a, err)
	}
	for _, bad := range [][]string{{}, {"f.js"}, {"run"}, {"run", "a.js", "b.js"}} {
		if _, err := parseScript(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseInterspersedStopsAtDoubleDash(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	v := fs.Bool("v", false, "")
	pos, err := parseInterspersed(fs, []string{"a", "-v", "b", "--", "-c", "d"})
	if err != nil || !*v || !reflect.DeepEqual(pos, []string{"a", "b", "-c", "d"}) {
		t.Fatalf("pos %q v %v err %v", pos, *v, err)
	}
}

func TestExpandBundles(t *testing.T) {
	fs := newFlagSet("x", "usage: x")
	fs.Bool("i", false, "")
	fs.Bool("t", false, "")
	fs.String("o", "", "")
	fs.Bool("all", false, "")
	for _, tt := range []struct{ in, want []string }{
		{[]string{"-it", "a"}, []string{"-i", "-t", "a"}},
		{[]string{"-io", "json", "-ti"}, []string{"-i", "-o", "json", "-t", "-i"}},
		{[]string{"-all", "--all", "-o", "-it"}, []string{"-all", "--all", "-o", "-it"}}, // -it is -o's value
		{[]string{"a", "-it"}, []string{"a", "-it"}},                                     // after an operand: not ours
		{[]string{"--", "-it"}, []string{"--", "-it"}},
		{[]string{"-ix"}, []string{"-ix"}}, // x is no flag: left for fs.Parse to refuse
	} {
		if got := expandBundles(fs, tt.in); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("expandBundles(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestParseShellsRunFlagsAnywhere(t *testing.T) {
	lease, session, cmd, timeout, asJSON, err := parseShellsRun([]string{"L1", "--timeout", "2s", "S1", "-o", "json", "ls", "-l"})
	if err != nil || lease != "L1" || session != "S1" || cmd != "ls -l" || timeout != 2*time.Second || !asJSON {
		t.Fatalf("got %q %q %q %v %v %v", lease, session, cmd, timeout, asJSON, err)
	}
}

func TestErrorLineHasOnePrefix(t *testing.T) {
	for in, want := range map[string]string{
		"sidecar: lease not found [404 lease_not_found]": "sidecar: lease not found [404 lease_not_found]",
		"client configuration: x":                        "sidecar: client configuration: x",
		"sidecar: sidecar: twice":                        "sidecar: twice",
		"L1: sidecar: lease not found":                   "sidecar: L1: lease not found",
	} {
		if got := errorLine(errors.New(in)); got != want {
			t.Errorf("errorLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLeaseTable(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	leases := []apitype.Lease{
		{ID: "L1", SessionID: "sess-a", State: "active", ExpiresAt: now.Add(14*time.Minute + 3*time.Second), Processes: 2, LeftoverCount: 1,
			Limits: apitype.Limits{MemoryBytes: 512 << 20, DiskBytes: 1 << 30},
			Usage:  &apitype.Usage{MemoryBytes: 12 << 20, CPUSeconds: 1.25, DiskBytes: 3 << 10}},
		{ID: "L2", SessionID: "sess-b", State: "expired", ExpiresAt: now.Add(-5 * time.Second),
			Network:      apitype.NetworkPolicy{Egress: "allowlist", AllowOut: []string{"pypi.org", "10.0.0.5"}},
			NetworkStats: &apitype.NetworkStats{BytesSent: 2048, BytesReceived: 3 << 20}},
	}
	var buf bytes.Buffer
	if err := writeLeaseTable(&buf, leases, now); err != nil {
		t.Fatal(err)
	}
	want := `ID  SESSION  STATE    EXPIRES   PROCS  LEFT  MEM               CPU   DISK           EGRESS       SENT    RECV
L1  sess-a   active   in 14m3s  2      1     12.0MiB/512.0MiB  1.2s  3.0KiB/1.0GiB  -            -       -
L2  sess-b   expired  5s ago    0      0     -                 -     -              allowlist+2  2.0KiB  3.0MiB
`
	if got := buf.String(); got != want {
		t.Fatalf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestExitFor(t *testing.T) {
	tests := []struct {
		code     int
		sig      string
		timedOut bool
		want     int
	}{
		{0, "", false, 0},
		{3, "", false, 3},
		{-1, "KILL", false, 137},
		{-1, "SIGTERM", false, 143},
		{-1, "", true, 124},
	}
	for _, tt := range tests {
		err := exitFor(tt.code, tt.sig, tt.timedOut)
		var ee exitError
		got := 0
		if errors.As(err, &ee) {
			got = ee.code
		}
		if got != tt.want {
			t.Errorf("exitFor(%d, %q, %v) = %d, want %d", tt.code, tt.sig, tt.timedOut, got, tt.want)
		}
	}
}

func TestTokenAndBytes(t *testing.T) {
	a, b := newToken(), newToken()
	if len(a) != 43 || a == b || strings.ContainsAny(a, "+/=") {
		t.Fatalf("tokens %q %q", a, b)
	}
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1.0KiB", 1536 << 20: "1.5GiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// [LOCAL:]REMOTE as kubectl port-forward reads it.
func TestParsePortForward(t *testing.T) {
	id, specs, err := parsePortForward([]string{"L1", "8000", "5433:5432", ":6379", "0:80"})
	if err != nil {
		t.Fatal(err)
	}
	want := []portSpec{{8000, 8000}, {5433, 5432}, {0, 6379}, {0, 80}}
	if id != "L1" || !reflect.DeepEqual(specs, want) {
		t.Errorf("got %q %v, want L1 %v", id, specs, want)
	}
	for _, bad := range [][]string{{"L1"}, {"L1", "0"}, {"L1", "8000:"}, {"L1", "a:80"}, {"L1", "70000:80"}, {"L1", "80:70000"}, {"L1", "-1:80"}} {
		if _, _, err := parsePortForward(bad); !isUsageError(err) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
}
