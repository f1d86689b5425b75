package lease

import (
	"errors"
	"testing"
)

var errNoSuchImage = errors.New("no such image")

// TestAcquireImage: a request's image is the default when it names none, checked by
// the daemon's hook, kept in the lease and in its record across a restart.
func TestAcquireImage(t *testing.T) {
	var checked []string
	e := newEnv(t, func(c *Config) {
		c.DefaultImage = "base"
		c.CheckImage = func(name string) error {
			checked = append(checked, name)
			if name != "base" && name != "py" {
				return errNoSuchImage
			}
			return nil
		}
	})
	m := e.open()
	for _, c := range []struct{ session, image, want string }{
		{"s1", "", "base"},
		{"s2", "py", "py"},
		{"s3", HostImage, ""},
	} {
		l := mustAcquire(t, m, Request{SessionID: c.session, Image: c.image})
		if l.Image != c.want {
			t.Errorf("image %q: lease image %q, want %q", c.image, l.Image, c.want)
		}
	}
	if _, _, err := m.Acquire(t.Context(), Request{SessionID: "s4", Image: "nope"}); !errors.Is(err, errNoSuchImage) {
		t.Fatalf("unknown image: %v", err)
	}
	if len(checked) != 3 || checked[2] != "nope" {
		t.Fatalf("checked %v", checked)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m2 := e.open()
	for _, l := range m2.List() {
		want := map[string]string{"s1": "base", "s2": "py", "s3": ""}[l.SessionID]
		if l.Image != want {
			t.Errorf("after reopening, %s runs on %q, want %q", l.SessionID, l.Image, want)
		}
	}
	if len(m2.List()) != 3 {
		t.Fatalf("leases after reopening: %d", len(m2.List()))
	}
}

func TestAcquireImageWithoutImages(t *testing.T) {
	m := newEnv(t).open()
	if _, _, err := m.Acquire(t.Context(), Request{SessionID: "s", Image: "py"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an image on a daemon without images: %v", err)
	}
	if l := mustAcquire(t, m, Request{SessionID: "s", Image: HostImage}); l.Image != "" {
		t.Fatalf("host image: %q", l.Image)
	}
}
