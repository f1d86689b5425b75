package charttest

// The chart's preStop drain, run for real: the chart is rendered for a TLS option, the
// Secrets it mounts are laid out as the kubelet would (each key a file under the mount
// path), the built daemon is started with the rendered container's environment, and the
// rendered preStop command runs with that environment and the pod's /etc/hosts (the
// rendered hostAliases, bind-mounted in a private mount namespace). It must drain the
// daemon, wait for the last lease, and succeed.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	binPath     = "../../bin/sidecar"
	serviceHost = "sandbox-sidecar.platform.svc" // release "sandbox", namespace "platform"
)

// pod is what the test needs of a rendered chart: the daemon container, the pod's
// volumes and host aliases, and the Secrets and Certificate the chart itself made.
type pod struct {
	container   corev1.Container
	volumes     []corev1.Volume
	hostAliases []corev1.HostAlias
	secrets     map[string]corev1.Secret // by name
	certNames   []string                 // the cert-manager Certificate's dnsNames
}

func renderPod(t *testing.T, values map[string]any) pod {
	t.Helper()
	docs, err := render(t, values)
	if err != nil {
		t.Fatal(err)
	}
	p := pod{secrets: map[string]corev1.Secret{}}
	for name, body := range docs {
		for _, doc := range strings.Split(body, "\n---") {
			var meta struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			switch meta.Kind {
			case "StatefulSet":
				var s appsv1.StatefulSet
				strict(t, name, doc, &s)
				p.container = s.Spec.Template.Spec.Containers[0]
				p.volumes = s.Spec.Template.Spec.Volumes
				p.hostAliases = s.Spec.Template.Spec.HostAliases
			case "Secret":
				var s corev1.Secret
				strict(t, name, doc, &s)
				p.secrets[s.Name] = s
			case "Certificate":
				var c struct {
					Spec struct {
						DNSNames []string `json:"dnsNames"`
					} `json:"spec"`
				}
				if err := yaml.Unmarshal([]byte(doc), &c); err != nil {
					t.Fatal(err)
				}
				p.certNames = c.Spec.DNSNames
			}
		}
	}
	return p
}

// secretFiles is a Secret's content as the kubelet mounts it: each key a file.
func secretFiles(s corev1.Secret) map[string][]byte {
	files := map[string][]byte{}
	for k, v := range s.Data {
		files[k] = v
	}
	for k, v := range s.StringData {
		files[k] = []byte(v)
	}
	return files
}

// sidecarCLI runs the built binary (the recipe's `sidecar token`, `sidecar tls gen`).
func sidecarCLI(t *testing.T, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(binPath, args...).Output()
	if err != nil {
		t.Fatalf("sidecar %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// tlsGen runs the documented recipe's `sidecar tls gen` for hosts and returns its files.
func tlsGen(t *testing.T, hosts ...string) (crt, key, ca []byte) {
	t.Helper()
	dir := t.TempDir()
	args := []string{"tls", "gen", "--dir", dir}
	for _, h := range hosts {
		args = append(args, "--host", h)
	}
	sidecarCLI(t, args...)
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	return read("server.crt"), read("server.key"), read("ca.crt")
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the pod's /etc/hosts is bind-mounted in a private mount namespace (CI runs make chart-test as root)")
	}
	if _, err := os.Stat(binPath); err != nil {
		t.Fatalf("%s: %v (make chart-test builds it first)", binPath, err)
	}
}

// The test's own settings over each option's: a free loopback port, a cgroup parent and
// uid range of its own (away from other daemons on the machine), and no disk quota (the
// drain does not depend on it, and no loop device is left behind).
func testValues(port int, values map[string]any) map[string]any {
	v := map[string]any{
		"port":         port,
		"drainSeconds": 60,
		"config": map[string]any{
			"SIDECAR_DISK_QUOTA":    "off",
			"SIDECAR_LOG_FORMAT":    "text",
			"SIDECAR_CGROUP_PARENT": fmt.Sprintf("sidecar-charttest-%d-%d", os.Getpid(), port),
			"SIDECAR_UID_RANGE":     "241000-241099",
		},
	}
	for k, x := range values {
		v[k] = x
	}
	return v
}

func TestPreStopDrainsWithEachTLSOption(t *testing.T) {
	needRoot(t)
	token := strings.TrimSpace(string(sidecarCLI(t, "token")))
	tokenSecret := corev1.Secret{StringData: map[string]string{"auth-token": token}}
	existing := map[string]any{
		"auth": map[string]any{"existingSecret": "sandbox-sidecar-token"},
		"tls":  map[string]any{"existingSecret": "sandbox-sidecar-tls"},
	}

	for _, tc := range []struct {
		name   string
		values map[string]any
		// secrets the operator made (the chart's own come from the render); nil: the
		// cert-manager layout for the rendered Certificate's names.
		secrets func(p pod) map[string]corev1.Secret
	}{
		{"kubectl create secret tls, certificate naming only the Service", existing, func(pod) map[string]corev1.Secret {
			crt, key, _ := tlsGen(t, serviceHost)
			return map[string]corev1.Secret{"sandbox-sidecar-token": tokenSecret,
				"sandbox-sidecar-tls": {Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}}
		}},
		{"kubectl create secret tls, the documented recipe", existing, func(pod) map[string]corev1.Secret {
			crt, key, _ := tlsGen(t, serviceHost, "*."+serviceHost)
			return map[string]corev1.Secret{"sandbox-sidecar-token": tokenSecret,
				"sandbox-sidecar-tls": {Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}}
		}},
		{"cert-manager", map[string]any{
			"auth": map[string]any{"existingSecret": "sandbox-sidecar-token"},
			"tls":  map[string]any{"certManager": map[string]any{"enabled": true, "issuerRef": map[string]any{"name": "ca"}}},
		}, func(p pod) map[string]corev1.Secret {
			// What cert-manager's CA issuer writes for the rendered Certificate.
			crt, key, ca := tlsGen(t, p.certNames...)
			return map[string]corev1.Secret{"sandbox-sidecar-token": tokenSecret,
				"sandbox-sidecar-tls": {Data: map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": ca}}}
		}},
		{"values-dev.yaml (the chart makes the token and the certificate)", devValues(t), func(pod) map[string]corev1.Secret { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := freePort(t)
			p := renderPod(t, testValues(port, tc.values))
			for name, s := range tc.secrets(p) {
				p.secrets[name] = s
			}
			d := startPod(t, p, port)

			lease := d.acquire(t)
			prestop := d.runPreStop(t)
			d.waitDraining(t, prestop)
			select {
			case <-prestop.done:
				t.Fatalf("preStop returned with a lease active: %v\n%s", prestop.err, prestop.out.String())
			default:
			}
			d.release(t, lease)
			select {
			case <-prestop.done:
			case <-time.After(time.Minute):
				t.Fatalf("preStop still waiting a minute after the last lease ended:\n%s", prestop.out.String())
			}
			if prestop.err != nil || !strings.Contains(prestop.out.String(), "draining; 0 leases active") {
				t.Fatalf("preStop: %v\n%s", prestop.err, prestop.out.String())
			}
		})
	}
}

// A certificate that does not name the Service fails the preStop, saying why: the check
// above is a real one.
func TestPreStopRefusesCertificateWithoutServiceName(t *testing.T) {
	needRoot(t)
	port := freePort(t)
	p := renderPod(t, testValues(port, map[string]any{
		"auth": map[string]any{"existingSecret": "sidecar-token"},
		"tls":  map[string]any{"existingSecret": "sidecar-tls"},
	}))
	crt, key, _ := tlsGen(t, "sidecar.example.com")
	p.secrets["sidecar-token"] = corev1.Secret{StringData: map[string]string{"auth-token": strings.TrimSpace(string(sidecarCLI(t, "token")))}}
	p.secrets["sidecar-tls"] = corev1.Secret{Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}
	d := startPod(t, p, port)
	prestop := d.runPreStop(t)
	<-prestop.done
	if prestop.err == nil || !strings.Contains(prestop.out.String(), "certificate") {
		t.Fatalf("preStop against a certificate not naming %s: %v\n%s", serviceHost, prestop.err, prestop.out.String())
	}
	if d.info(t).Draining {
		t.Fatal("the daemon drains although the preStop could not verify it")
	}
}

// daemon is the pod's container run on this machine.
type daemon struct {
	env     []string // the container's environment, paths mapped to the test's
	command []string // the preStop command, likewise
	hosts   string   // the pod's /etc/hosts
	token   string
	hc      *http.Client
	base    string
}

// startPod lays out the pod's volumes, starts the daemon with the container's
// environment, and waits until it answers.
func startPod(t *testing.T, p pod, port int) *daemon {
	t.Helper()
	mapPath := layout(t, p)
	d := &daemon{base: fmt.Sprintf("https://%s:%d", serviceHost, port), env: podEnv(t, p, mapPath)}
	for _, a := range p.container.Lifecycle.PreStop.Exec.Command {
		d.command = append(d.command, mapPath(a))
	}
	d.hosts = "127.0.0.1 localhost\n"
	for _, h := range p.hostAliases {
		d.hosts += h.IP + " " + strings.Join(h.Hostnames, " ") + "\n"
	}
	tok, err := os.ReadFile(mapPath(envOf(t, p.container, "SIDECAR_AUTH_TOKEN_FILE")))
	if err != nil {
		t.Fatal(err)
	}
	d.token = strings.TrimSpace(string(tok))
	d.hc = testClient(t, mapPath(envOf(t, p.container, "SIDECAR_TLS_CERT_FILE")), port)
	d.serve(t, mapPath("/usr/local/bin/sidecar"), envOf(t, p.container, "SIDECAR_CGROUP_PARENT"))
	return d
}

// layout makes a directory for each of the container's volume mounts, fills the Secret
// ones with their keys, and returns the mapping of a path in the pod to one here (the
// image's sidecar to the built one).
func layout(t *testing.T, p pod) func(string) string {
	t.Helper()
	// Under /var/tmp: lease uids must traverse every ancestor of the state dir (t.TempDir's
	// parent is 0700), and a lease's private /tmp would hide a work root under /tmp.
	root, err := os.MkdirTemp("/var/tmp", "sidecar-charttest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { removeTree(t, root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{} // mount path in the pod → directory here
	for _, m := range p.container.VolumeMounts {
		dir := filepath.Join(root, m.Name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		paths[m.MountPath] = dir
		for _, v := range p.volumes {
			if v.Name == m.Name && v.Secret != nil {
				writeSecret(t, p, v.Secret.SecretName, dir)
			}
		}
	}
	bin, err := filepath.Abs(binPath)
	if err != nil {
		t.Fatal(err)
	}
	return func(s string) string {
		if s == "/usr/local/bin/sidecar" {
			return bin
		}
		for from, to := range paths {
			if s == from || strings.HasPrefix(s, from+"/") {
				return to + strings.TrimPrefix(s, from)
			}
		}
		return s
	}
}

// writeSecret writes the keys of the Secret name into dir, as the kubelet mounts them.
func writeSecret(t *testing.T, p pod, name, dir string) {
	t.Helper()
	s, ok := p.secrets[name]
	if !ok {
		t.Fatalf("the pod mounts Secret %q, which neither the chart nor the operator made", name)
	}
	for k, b := range secretFiles(s) {
		if err := os.WriteFile(filepath.Join(dir, k), b, 0o400); err != nil {
			t.Fatal(err)
		}
	}
}

// podEnv is the container's environment with its paths mapped here.
func podEnv(t *testing.T, p pod, mapPath func(string) string) []string {
	t.Helper()
	var env []string
	for _, e := range p.container.Env {
		v := e.Value
		switch {
		case e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
			v = strconv.FormatInt(p.container.Resources.Limits.Memory().Value(), 10)
		case e.ValueFrom != nil:
			t.Fatalf("env %s: a source this test does not know: %+v", e.Name, e.ValueFrom)
		case strings.Contains(v, "$("):
			t.Fatalf("env %s=%s: a reference this test does not expand", e.Name, v)
		case e.Name == "SIDECAR_LISTEN_ADDR":
			// The pod listens on every address; here, on loopback only.
			v = strings.Replace(v, "0.0.0.0:", "127.0.0.1:", 1)
		}
		env = append(env, e.Name+"="+mapPath(v))
	}
	return append(env, "PATH="+os.Getenv("PATH"))
}

// testClient is the test's own client, dialling loopback: it trusts the served
// certificate and checks it against the first name in it (the preStop's check is the one
// under test).
func testClient(t *testing.T, certFile string, port int) *http.Client {
	t.Helper()
	crt, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(crt)
	blk, _ := pem.Decode(crt)
	if blk == nil {
		t.Fatalf("%s holds no PEM certificate", certFile)
	}
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: leaf.DNSNames[0]},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
}

// serve starts `sidecar serve` with the pod's environment, stops it and removes its
// cgroup parent when the test ends, and waits until /healthz answers.
func (d *daemon) serve(t *testing.T, bin, cgroupParent string) {
	t.Helper()
	cmd := exec.Command(bin, "serve")
	cmd.Env = d.env
	log := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		removeCgroupParent(t, cgroupParent)
		if t.Failed() {
			t.Logf("daemon log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := d.hc.Get(d.base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			t.Fatalf("sidecar serve exited at start:\n%s", log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sidecar serve did not answer within a minute: %v\n%s", err, log.String())
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

func envOf(t *testing.T, c corev1.Container, name string) string {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	t.Fatalf("the container has no %s", name)
	return ""
}

func (d *daemon) call(t *testing.T, method, path string, body any, want int, out any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, d.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, b, want)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatal(err)
		}
	}
}

// acquire makes a lease, released at the test's end if the test has not (before the
// daemon stops: a lease outlives its daemon, cgroup and all).
func (d *daemon) acquire(t *testing.T) string {
	var l struct{ ID string }
	d.call(t, http.MethodPost, "/v1/leases", map[string]any{"session_id": "prestop"}, http.StatusCreated, &l)
	t.Cleanup(func() {
		req, _ := http.NewRequest(http.MethodDelete, d.base+"/v1/leases/"+l.ID, nil)
		req.Header.Set("Authorization", "Bearer "+d.token)
		if resp, err := d.hc.Do(req); err == nil {
			resp.Body.Close()
		}
	})
	return l.ID
}

func (d *daemon) release(t *testing.T, id string) {
	d.call(t, http.MethodDelete, "/v1/leases/"+id, nil, http.StatusNoContent, nil)
}

type info struct {
	Draining bool `json:"draining"`
}

func (d *daemon) info(t *testing.T) info {
	var i info
	d.call(t, http.MethodGet, "/v1/info", nil, http.StatusOK, &i)
	return i
}

// prestopRun is the preStop command running (or done).
type prestopRun struct {
	out  *lockedBuffer
	done chan struct{}
	err  error // set before done closes
}

// runPreStop starts the rendered preStop command as the kubelet would run it in the
// container: its environment, and the pod's /etc/hosts.
func (d *daemon) runPreStop(t *testing.T) *prestopRun {
	t.Helper()
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte(d.hosts), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--mount", "--propagation", "private", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hosts}, d.command...)
	cmd := exec.Command("unshare", args...)
	cmd.Env = d.env
	r := &prestopRun{out: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.err = cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			_ = cmd.Process.Kill()
			<-r.done
		}
	})
	return r
}

// waitDraining polls until the daemon says it is draining.
func (d *daemon) waitDraining(t *testing.T, r *prestopRun) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !d.info(t).Draining {
		select {
		case <-r.done:
			t.Fatalf("preStop ended without draining: %v\n%s", r.err, r.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("not draining a minute after the preStop started:\n%s", r.out.String())
		}
		time.Sleep(50 * time.Millisecond) // poll interval
	}
}

// lockedBuffer is a bytes.Buffer written by a process and read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// removeTree removes the test's tree unless something is mounted under it (never
// through a mount point).
func removeTree(t *testing.T, root string) {
	mounts, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Errorf("left %s in place: %v", root, err)
		return
	}
	for line := range strings.SplitSeq(string(mounts), "\n") {
		if m := strings.Fields(line); len(m) > 4 && strings.HasPrefix(m[4], root+"/") {
			t.Errorf("left %s in place: %s is mounted", root, m[4])
			return
		}
	}
	if err := os.RemoveAll(root); err != nil {
		t.Error(err)
	}
}

// removeCgroupParent removes the daemon's cgroup parent in every hierarchy once it has
// stopped; rmdir removes only an empty cgroup.
func removeCgroupParent(t *testing.T, parent string) {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + parent)
	dirs = append(dirs, "/sys/fs/cgroup/"+parent)
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ENOTDIR) {
			t.Errorf("cgroup %s left: %v", d, err)
		}
	}
}

// The recipe in docs/operations.md makes the Secrets the documented-recipe case above
// lays out: the same names in the certificate, the same keys in the Secrets.
func TestSecretRecipeInDocs(t *testing.T) {
	ops, err := readOperations()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"sidecar tls gen --dir tls --host " + serviceHost + " --host '*." + serviceHost + "'",
		"kubectl -n platform create secret tls sandbox-sidecar-tls --cert=tls/server.crt --key=tls/server.key",
		"kubectl -n platform create secret generic sandbox-sidecar-token --from-file=auth-token=auth-token",
	} {
		if !bytes.Contains(ops, []byte(line)) {
			t.Errorf("docs/operations.md lacks the recipe line %q", line)
		}
	}
}
