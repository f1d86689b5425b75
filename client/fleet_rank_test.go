package client

import "testing"

// The rendezvous hash is part of placement's contract: the TypeScript client
// (client/ts/src/fleet.ts) hashes alike, so that Go and TypeScript processes place one
// session on the same two candidates. client/ts/test/fleet.test.ts asserts these very
// figures; change both or neither.
var rankVectors = []struct {
	session, member string
	want            uint64
}{
	{"session-1", "https://127.0.0.1:7443", 0x2df69e4a598e24df},
	{"session-1", "https://10.0.0.2:7443", 0xd4b2c46889c5a61f},
	{"session-1", "https://sidecar-2.sidecar.ns.svc:7443", 0xa5185e5aa6c88dce},
	{"s2", "https://127.0.0.1:7443", 0x69a201c0ab312488},
	{"s2", "https://10.0.0.2:7443", 0x04de91e3f5c35f06},
	{"s2", "https://sidecar-2.sidecar.ns.svc:7443", 0x6454b8f85ac631f7},
	{"日本", "https://127.0.0.1:7443", 0x28ac21850210d9f3},
	{"日本", "https://10.0.0.2:7443", 0x0c758be8a3de76f3},
	{"日本", "https://sidecar-2.sidecar.ns.svc:7443", 0x23e6a8552c81736a},
}

func TestRankVectors(t *testing.T) {
	for _, v := range rankVectors {
		if got := rank(v.session, v.member); got != v.want {
			t.Errorf("rank(%q, %q) = %#016x, want %#016x", v.session, v.member, got, v.want)
		}
	}
	// The member string hashed is the URL as parsed: trimmed, no trailing slash, scheme
	// in lower case, host as written.
	c, err := New(Config{URL: " https://127.0.0.1:7443/ ,HTTPS://Sidecar-B:7443//"})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"https://127.0.0.1:7443", "https://Sidecar-B:7443"} {
		if got := c.fleet.members[i].url; got != want {
			t.Errorf("member %d hashed as %q, want %q", i, got, want)
		}
	}
}
