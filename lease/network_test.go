package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sidecar-sandbox/sidecar/lease/netpolicy"
)

// networkProvisioner records the policies SetNetwork applies.
type networkProvisioner struct {
	*fakeProvisioner
	applied []netpolicy.Policy
	fail    error
}

func (p *networkProvisioner) SetNetwork(_ context.Context, l Lease) error {
	if p.fail != nil {
		return p.fail
	}
	p.applied = append(p.applied, l.Network)
	return nil
}

func TestSetNetworkAppliesAndPersists(t *testing.T) {
	np := &networkProvisioner{fakeProvisioner: newProvisioner()}
	e := newEnv(t, func(c *Config) { c.Provisioner = np })
	m := e.open()
	l := mustAcquire(t, m, Request{SessionID: "s", TTL: time.Hour})
	if l.Network.Egress != netpolicy.EgressInternet {
		t.Fatalf("default policy %+v, want internet", l.Network)
	}
	want := netpolicy.Policy{Egress: netpolicy.EgressAllowlist, AllowOut: []string{"pypi.org", "*.pythonhosted.org:443"}}
	got, err := m.SetNetwork(context.Background(), l.ID, want)
	if err != nil {
		t.Fatal(err)
	}
	if got.Network.Egress != want.Egress || len(np.applied) != 1 || np.applied[0].AllowOut[1] != want.AllowOut[1] {
		t.Fatalf("returned %+v, applied %+v", got.Network, np.applied)
	}
	if _, err := m.SetNetwork(context.Background(), l.ID, netpolicy.Policy{Egress: "host"}); !errors.Is(err, ErrInvalid) || !errors.Is(err, netpolicy.ErrInvalid) {
		t.Errorf("host as a lease's policy: %v", err)
	}
	np.fail = errors.New("boom")
	if _, err := m.SetNetwork(context.Background(), l.ID, netpolicy.Policy{Egress: netpolicy.EgressNone}); err == nil {
		t.Error("a policy the provisioner could not apply was accepted")
	}
	if cur, _ := m.Get(l.ID); cur.Network.Egress != netpolicy.EgressAllowlist {
		t.Errorf("after a failed replace the lease has %+v", cur.Network)
	}
	if _, err := m.SetNetwork(context.Background(), "nope", want); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown lease: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m2 := e.open()
	if cur, err := m2.Get(l.ID); err != nil || cur.Network.Egress != netpolicy.EgressAllowlist || len(cur.Network.AllowOut) != 2 {
		t.Errorf("after a restart: %+v %v", cur.Network, err)
	}
}

// A state written before leases had network policies holds "host" or "none".
func TestStoredNetworkStringsReadBack(t *testing.T) {
	e := newEnv(t)
	now := e.clock.Now()
	ids := []string{newID(), newID()}
	state := `{"version":1,"leases":[` +
		`{"id":"` + ids[0] + `","session_id":"a","network":"host","limits":{},"created_at":"` + now.Format(time.RFC3339Nano) + `","expires_at":"` + now.Add(time.Hour).Format(time.RFC3339Nano) + `","last_activity_at":"` + now.Format(time.RFC3339Nano) + `"},` +
		`{"id":"` + ids[1] + `","session_id":"b","network":"none","limits":{},"created_at":"` + now.Format(time.RFC3339Nano) + `","expires_at":"` + now.Add(time.Hour).Format(time.RFC3339Nano) + `","last_activity_at":"` + now.Format(time.RFC3339Nano) + `"}]}`
	ls, err := decodeState([]byte(state), e.cfg.WorkRoot)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 2 || ls[0].Network.Egress != netpolicy.EgressInternet || ls[1].Network.Egress != netpolicy.EgressNone {
		t.Fatalf("read back %+v", ls)
	}
}
