package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	leasenet "github.com/sidecar-sandbox/sidecar/lease/network"
)

// envd is E2B's in-sandbox daemon as a peer (-envd): the binary its user built from a
// pinned source outside this repository (docs/benchmarks.md says how), never one of ours.
// It listens on every address of its network namespace, so it runs in one the run makes
// (and a mount namespace with a /run of its own), and the client dials in there. It runs
// commands as root, in no cgroup (-no-cgroups), over plain HTTP: what it does in E2B's
// VM, minus the VM.
type envd struct {
	ns      string // the network namespace's name (ip netns)
	cmd     *exec.Cmd
	client  *http.Client
	version string
}

const envdAddr = "127.0.0.1:49983"

func startEnvd(ctx context.Context, log *slog.Logger, bin string) (*envd, error) {
	ver, err := exec.CommandContext(ctx, bin, "-version").Output()
	if err != nil {
		return nil, fmt.Errorf("envd %s -version: %w", bin, err)
	}
	e := &envd{ns: fmt.Sprintf("sidecar-bench-envd-%d", os.Getpid()), version: strings.TrimSpace(string(ver))}
	for _, args := range [][]string{{"netns", "add", e.ns}, {"-n", e.ns, "link", "set", "lo", "up"}} {
		if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
			e.stop(log)
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	// envd writes its marker files under /run/e2b: a /run of its own keeps the host's clean.
	e.cmd = exec.CommandContext(ctx, "ip", "netns", "exec", e.ns, "unshare", "-m", "--propagation", "private",
		"sh", "-c", `mount -t tmpfs -o mode=755 envd /run && exec "$0" "$@"`, bin, "-isnotfc", "-no-cgroups", "-port", "49983")
	e.cmd.Stdout, e.cmd.Stderr = io.Discard, io.Discard
	if err := e.cmd.Start(); err != nil {
		e.stop(log)
		return nil, err
	}
	ns := "/run/netns/" + e.ns
	e.client = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialIn(ctx, ns, network, addr)
		},
		MaxIdleConnsPerHost: 16,
	}}
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := e.client.Get("http://" + envdAddr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				break
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			e.stop(log)
			return nil, fmt.Errorf("envd not ready: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Info("envd ready", "version", e.version, "namespace", e.ns)
	return e, nil
}

// dialIn dials addr from inside the network namespace at ns (a socket stays in the
// namespace it was made in).
func dialIn(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	f, err := os.Open(ns)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var c net.Conn
	err = leasenet.InNetNS(f, func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// run runs argv to completion through envd's process API as its SDKs do: a Connect
// server stream (process.Process/Start, JSON), read to the end event. It insists on
// exit status 0.
func (e *envd) run(ctx context.Context, argv ...string) error {
	msg, err := json.Marshal(map[string]any{"process": map[string]any{"cmd": argv[0], "args": argv[1:]}})
	if err != nil {
		return err
	}
	var body bytes.Buffer
	body.Write([]byte{0, 0, 0, 0, 0})
	binary.BigEndian.PutUint32(body.Bytes()[1:], uint32(len(msg)))
	body.Write(msg)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+envdAddr+"/process.Process/Start", &body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.SetBasicAuth("root", "")
	resp, err := e.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("envd: %s: %s", resp.Status, b)
	}
	r := bufio.NewReader(resp.Body)
	ended := false
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return fmt.Errorf("envd stream: %w", err)
		}
		frame := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(r, frame); err != nil {
			return fmt.Errorf("envd stream: %w", err)
		}
		if hdr[0]&2 != 0 { // end of stream: {} or {"error": …}
			if !ended {
				return fmt.Errorf("envd stream ended without the process's end: %s", frame)
			}
			_, _ = io.Copy(io.Discard, r)
			return nil
		}
		var ev struct {
			Event struct {
				End *struct {
					ExitCode int    `json:"exitCode"`
					Exited   bool   `json:"exited"`
					Status   string `json:"status"`
				} `json:"end"`
			} `json:"event"`
		}
		if err := json.Unmarshal(frame, &ev); err != nil {
			return fmt.Errorf("envd event %q: %w", frame, err)
		}
		if end := ev.Event.End; end != nil {
			if !end.Exited || end.ExitCode != 0 {
				return fmt.Errorf("envd: %s ended %q", argv[0], end.Status)
			}
			ended = true
		}
	}
}

func (e *envd) stop(log *slog.Logger) {
	if e.cmd != nil && e.cmd.Process != nil {
		_ = e.cmd.Process.Kill()
		_ = e.cmd.Wait()
	}
	if out, err := exec.Command("ip", "netns", "delete", e.ns).CombinedOutput(); err != nil {
		log.Warn("envd's network namespace left behind", "ns", e.ns, "err", err, "out", string(out))
	}
}
