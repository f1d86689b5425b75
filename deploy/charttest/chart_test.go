// Package charttest renders the Helm chart under deploy/helm/sidecar with Helm's own
// engine and decodes every object strictly into the Kubernetes API types: a field that
// the API does not know, a wrong type or a duplicate key fails the test. It is a module
// of its own so that Helm and the Kubernetes types stay out of the daemon's.
package charttest

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const chartDir = "../helm/sidecar"

// render renders the chart with values over its defaults and returns the manifests by
// template name (empty ones left out).
func render(t *testing.T, values map[string]any) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: "sandbox", Namespace: "platform", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, vals)
	if err != nil {
		return nil, err
	}
	docs := map[string]string{}
	for name, body := range out {
		if strings.HasSuffix(name, "NOTES.txt") || strings.TrimSpace(body) == "" {
			continue
		}
		docs[name] = body
	}
	return docs, nil
}

// strict decodes one YAML object into v, refusing unknown and duplicate fields.
func strict(t *testing.T, name, body string, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict([]byte(body), v); err != nil {
		t.Fatalf("%s does not decode strictly: %v\n%s", name, err, body)
	}
}

var base = map[string]any{
	"auth": map[string]any{"existingSecret": "sidecar-token"},
	"tls":  map[string]any{"existingSecret": "sidecar-tls"},
}

// devValues is values-dev.yaml.
func devValues(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values-dev.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	v := map[string]any{}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// checkGeneratedTLS: the chart's own certificate names the Service and each pod and is
// issued by the ca.crt beside it.
func checkGeneratedTLS(t *testing.T, s corev1.Secret) {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.Data["ca.crt"]) {
		t.Fatalf("secret %s: no ca.crt", s.Name)
	}
	blk, _ := pem.Decode(s.Data["tls.crt"])
	if blk == nil {
		t.Fatalf("secret %s: no tls.crt", s.Name)
	}
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sandbox-sidecar.platform.svc", "sandbox-sidecar-2.sandbox-sidecar.platform.svc"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool}); err != nil {
			t.Errorf("generated certificate for %s: %v", name, err)
		}
	}
	if _, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"]); err != nil {
		t.Errorf("generated key pair: %v", err)
	}
}

func TestChartRendersStrictly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   []string // kinds
	}{
		{"existing secrets", base, []string{"PodDisruptionBudget", "Service", "StatefulSet"}},
		{"token value, cert-manager, capabilities", map[string]any{
			"auth":            map[string]any{"token": strings.Repeat("x", 40)},
			"tls":             map[string]any{"certManager": map[string]any{"enabled": true, "issuerRef": map[string]any{"name": "ca"}}},
			"securityContext": map[string]any{"privileged": false},
		}, []string{"Certificate", "PodDisruptionBudget", "Secret", "Service", "StatefulSet"}},
		{"values-dev.yaml", devValues(t), []string{"PodDisruptionBudget", "Secret", "Secret", "Service", "StatefulSet"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			docs, err := render(t, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for name, body := range docs {
				for _, doc := range strings.Split(body, "\n---") {
					if strings.TrimSpace(doc) == "" {
						continue
					}
					var meta struct{ Kind string }
					if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					kinds = append(kinds, meta.Kind)
					checkObject(t, name, meta.Kind, doc, tc.values)
				}
			}
			slices.Sort(kinds)
			if !slices.Equal(kinds, tc.want) {
				t.Fatalf("kinds %v, want %v", kinds, tc.want)
			}
		})
	}
}

// checkObject decodes an object into its API type and checks what the chart promises.
func checkObject(t *testing.T, name, kind, doc string, values map[string]any) {
	t.Helper()
	switch kind {
	case "StatefulSet":
		var s appsv1.StatefulSet
		strict(t, name, doc, &s)
		checkStatefulSet(t, &s, values)
	case "Service":
		var s corev1.Service
		strict(t, name, doc, &s)
		if s.Spec.ClusterIP != corev1.ClusterIPNone || !s.Spec.PublishNotReadyAddresses {
			t.Errorf("service: clusterIP %q publishNotReadyAddresses %v; want headless, draining pods published", s.Spec.ClusterIP, s.Spec.PublishNotReadyAddresses)
		}
	case "PodDisruptionBudget":
		var p policyv1.PodDisruptionBudget
		strict(t, name, doc, &p)
		if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.IntValue() != 1 {
			t.Errorf("pdb: maxUnavailable %v, want 1", p.Spec.MaxUnavailable)
		}
	case "Secret":
		var s corev1.Secret
		strict(t, name, doc, &s)
		switch s.Type {
		case corev1.SecretTypeTLS:
			// tls.generate: a server certificate for the Service and its CA.
			checkGeneratedTLS(t, s)
		default:
			if len(s.StringData["auth-token"]) < 32 {
				t.Errorf("secret: no auth-token of 32 characters")
			}
		}
	case "Certificate":
		// cert-manager's type is not in k8s.io/api: decoded strictly into the fields
		// the chart sets, as cert-manager v1 names them.
		var c struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				SecretName  string   `json:"secretName"`
				Duration    string   `json:"duration"`
				RenewBefore string   `json:"renewBefore"`
				DNSNames    []string `json:"dnsNames"`
				PrivateKey  struct {
					Algorithm      string `json:"algorithm"`
					Size           int    `json:"size"`
					RotationPolicy string `json:"rotationPolicy"`
				} `json:"privateKey"`
				IssuerRef struct {
					Name  string `json:"name"`
					Kind  string `json:"kind"`
					Group string `json:"group"`
				} `json:"issuerRef"`
			} `json:"spec"`
		}
		strict(t, name, doc, &c)
		if c.APIVersion != "cert-manager.io/v1" || c.Spec.SecretName != "sandbox-sidecar-tls" || !slices.Contains(c.Spec.DNSNames, "sandbox-sidecar.platform.svc") || !slices.Contains(c.Spec.DNSNames, "*.sandbox-sidecar.platform.svc") {
			t.Errorf("certificate: %+v", c)
		}
	default:
		t.Fatalf("%s: unexpected kind %q", name, kind)
	}
}

func checkStatefulSet(t *testing.T, s *appsv1.StatefulSet, values map[string]any) {
	t.Helper()
	replicas := 3.0
	if r, ok := values["replicas"].(float64); ok {
		replicas = r
	}
	if s.Spec.ServiceName != "sandbox-sidecar" || s.Spec.Replicas == nil || float64(*s.Spec.Replicas) != replicas || len(s.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("statefulset: service %q replicas %v claims %d", s.Spec.ServiceName, s.Spec.Replicas, len(s.Spec.VolumeClaimTemplates))
	}
	pod := s.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("containers: %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("probes: readiness %+v liveness %+v", c.ReadinessProbe, c.LivenessProbe)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil || !slices.Contains(c.Lifecycle.PreStop.Exec.Command, "drain") {
		t.Errorf("preStop: %+v", c.Lifecycle)
	}
	drain := 900.0
	if d, ok := values["drainSeconds"].(float64); ok {
		drain = d
	}
	if pod.TerminationGracePeriodSeconds == nil || float64(*pod.TerminationGracePeriodSeconds) <= drain {
		t.Errorf("terminationGracePeriodSeconds %v must exceed the drain wait (%v s)", pod.TerminationGracePeriodSeconds, drain)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	for _, k := range []string{"SIDECAR_AUTH_TOKEN_FILE", "SIDECAR_TLS_CERT_FILE", "SIDECAR_TLS_KEY_FILE", "SIDECAR_LISTEN_ADDR", "SIDECAR_STATE_DIR", "SANDBOX_REMOTE_URL"} {
		if _, ok := env[k]; !ok {
			t.Errorf("env %s missing", k)
		}
	}
	if e := env["SIDECAR_CAPACITY_MEMORY_BYTES"]; e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil || e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" {
		t.Errorf("SIDECAR_CAPACITY_MEMORY_BYTES: %+v, want the pod's memory limit", e)
	}
	sc := c.SecurityContext
	priv := true
	if v, ok := values["securityContext"].(map[string]any); ok {
		priv = v["privileged"].(bool)
	}
	switch {
	case sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0:
		t.Errorf("securityContext: %+v, want root", sc)
	case priv && (sc.Privileged == nil || !*sc.Privileged):
		t.Errorf("privileged: %v", sc.Privileged)
	// NET_BIND_SERVICE: each lease's resolver listens on port 53 of its namespace;
	// SYS_CHROOT: each helper enters the mount namespace the daemon prepared.
	case !priv && (sc.Privileged == nil || *sc.Privileged || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Add, "SYS_ADMIN") ||
		!slices.Contains(sc.Capabilities.Add, "NET_BIND_SERVICE") || !slices.Contains(sc.Capabilities.Add, "SYS_CHROOT") ||
		!slices.Contains(sc.Capabilities.Drop, "ALL")):
		t.Errorf("capabilities: %+v", sc)
	}
}

// The chart refuses what cannot work, with a message saying what to set.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"auth": map[string]any{"token": "short"}, "tls": map[string]any{"existingSecret": "x"}}, "at least 32 characters"},
		{map[string]any{"auth": map[string]any{"existingSecret": "x"}}, "set tls.existingSecret, tls.certManager.enabled or, for development, tls.generate"},
		{map[string]any{"auth": map[string]any{"generate": true}, "tls": map[string]any{"generate": true, "existingSecret": "x"}}, "unset tls.existingSecret"},
	} {
		_, err := render(t, tc.values)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("values %v: err %v, want one saying %q", tc.values, err, tc.want)
		}
	}
}

// The platform-side snippet of docs/operations.md names the Service the chart makes.
func TestPlatformSnippetMatchesChart(t *testing.T) {
	docs, err := render(t, base)
	if err != nil {
		t.Fatal(err)
	}
	var svc corev1.Service
	strict(t, "service", docs["sidecar/templates/service.yaml"], &svc)
	ops, err := readOperations()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("https://%s.platform.svc:%d", svc.Name, svc.Spec.Ports[0].Port)
	if !bytes.Contains(ops, []byte(want)) {
		t.Fatalf("docs/operations.md's platform snippet does not name %s", want)
	}
}
