package charttest

import (
	"maps"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// Lease images in values become the daemon's variables, their store is on the state
// volume, and a registry Secret is the daemon's Docker config.
func TestChartLeaseImages(t *testing.T) {
	values := maps.Clone(base)
	values["images"] = map[string]any{
		"names":              map[string]any{"python": "docker.io/library/python:3.12-slim", "node": "registry.example/node@sha256:" + strings.Repeat("a", 64)},
		"default":            "python",
		"storeBytes":         "53687091200",
		"registryAuthSecret": "pull-secret",
		"root":               []any{"python", "node"},
		"snapshotMaxAge":     "168h",
	}
	docs, err := render(t, values)
	if err != nil {
		t.Fatal(err)
	}
	var s appsv1.StatefulSet
	strict(t, "statefulset", docs["sidecar/templates/statefulset.yaml"], &s)
	c := s.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	for name, want := range map[string]string{
		"SIDECAR_IMAGES":            "node=registry.example/node@sha256:" + strings.Repeat("a", 64) + ",python=docker.io/library/python:3.12-slim",
		"SIDECAR_DEFAULT_IMAGE":     "python",
		"SIDECAR_IMAGE_STORE_BYTES": "53687091200",
		"DOCKER_CONFIG":             "/etc/sidecar/registry",
		"SIDECAR_ROOT_IMAGES":       "python,node",
		"SIDECAR_SNAPSHOT_MAX_AGE":  "168h",
		"SIDECAR_STATE_DIR":         "/var/lib/sidecar", // the store is <state dir>/images
	} {
		if env[name] != want {
			t.Errorf("%s = %q, want %q", name, env[name], want)
		}
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	if m := mounts["state"]; m.MountPath != env["SIDECAR_STATE_DIR"] {
		t.Errorf("the state volume is mounted at %q, not the state dir", m.MountPath)
	}
	if m := mounts["registry"]; m.MountPath != env["DOCKER_CONFIG"] || !m.ReadOnly {
		t.Errorf("registry mount: %+v", m)
	}
	var registry *corev1.Volume
	for i, v := range s.Spec.Template.Spec.Volumes {
		if v.Name == "registry" {
			registry = &s.Spec.Template.Spec.Volumes[i]
		}
	}
	if registry == nil || registry.Secret == nil || registry.Secret.SecretName != "pull-secret" ||
		len(registry.Secret.Items) != 1 || registry.Secret.Items[0] != (corev1.KeyToPath{Key: ".dockerconfigjson", Path: "config.json"}) {
		t.Errorf("registry volume: %+v", registry)
	}

	// Without images the daemon gets none of these, and runs leases on the host's root.
	docs, err = render(t, base)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"SIDECAR_IMAGES", "SIDECAR_DEFAULT_IMAGE", "SIDECAR_IMAGE_STORE_BYTES", "SIDECAR_ROOT_IMAGES", "SIDECAR_SNAPSHOT_MAX_AGE", "DOCKER_CONFIG"} {
		if strings.Contains(docs["sidecar/templates/statefulset.yaml"], name) {
			t.Errorf("rendered without images, the StatefulSet sets %s", name)
		}
	}

	// The same variable from config too would be two values: refused.
	values = maps.Clone(base)
	values["config"] = map[string]any{"SIDECAR_IMAGES": "x=y"}
	if _, err := render(t, values); err == nil || !strings.Contains(err.Error(), "SIDECAR_IMAGES is set by images.names") {
		t.Errorf("SIDECAR_IMAGES in config: %v", err)
	}
}
