package client

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sidecar-sandbox/sidecar/client/apitype"
)

// TestPlacementSimulation places sessions over 100 modelled sidecars with the fleet's own
// ranking (rendezvous hash) and room (Room) functions, with leases arriving and leaving,
// and bounds the max/mean load ratio. A model, no daemons: what it checks is the choice
// rule, at a scale no machine here runs.
func TestPlacementSimulation(t *testing.T) {
	two, one := simulatePlacement(t, 2), simulatePlacement(t, 1)
	t.Logf("100 sidecars, 3200 leases held, 20000 arrivals and departures: worst max/mean load ratio %.3f with two choices, %.3f with one (a plain hash)", two, one)
	// The bound: with two choices the fullest sidecar stays within 1.3× the mean, and
	// clearly better than one choice.
	if two > 1.3 || two >= one {
		t.Fatalf("max/mean load ratio %.3f with two choices (bound 1.3), %.3f with one", two, one)
	}
}

func simulatePlacement(t *testing.T, choices int) float64 {
	const (
		sidecars  = 100
		maxLeases = 64
		memory    = int64(64 << 30)
		steps     = 20_000
		target    = 3_200 // leases held once warm: half of all slots
	)
	rng := rand.New(rand.NewPCG(18, 2026)) // fixed seed: the run is the same every time
	type sc struct {
		url   string
		cap   apitype.Capacity
		lease map[string]int64 // session → its memory limit
	}
	fleet := make([]*sc, sidecars)
	for i := range fleet {
		fleet[i] = &sc{url: fmt.Sprintf("https://10.0.%d.%d:7443", i/250, i%250), cap: apitype.Capacity{FreeLeases: maxLeases, MemoryBytes: memory, MemoryHeadroomBytes: memory}, lease: map[string]int64{}}
	}
	where := map[string]*sc{}
	var live []string
	place := func(session string, mem int64) {
		cands := slices.Clone(fleet)
		slices.SortFunc(cands, func(a, b *sc) int { return cmpUint(rank(session, b.url), rank(session, a.url)) })
		for len(cands) > 0 {
			two := cands[:min(choices, len(cands))]
			best := two[0]
			if len(two) == 2 && Room(two[1].cap, maxLeases) > Room(best.cap, maxLeases) {
				best = two[1]
			}
			if best.cap.FreeLeases == 0 || best.cap.MemoryHeadroomBytes < mem {
				cands = slices.DeleteFunc(cands, func(c *sc) bool { return c == best })
				continue
			}
			best.lease[session] = mem
			best.cap.ActiveLeases++
			best.cap.FreeLeases--
			best.cap.MemoryCommittedBytes += mem
			best.cap.MemoryHeadroomBytes -= mem
			where[session] = best
			live = append(live, session)
			return
		}
		t.Fatalf("no sidecar took %s", session)
	}
	release := func(i int) {
		session := live[i]
		s := where[session]
		mem := s.lease[session]
		delete(s.lease, session)
		delete(where, session)
		s.cap.ActiveLeases--
		s.cap.FreeLeases++
		s.cap.MemoryCommittedBytes -= mem
		s.cap.MemoryHeadroomBytes += mem
		live[i] = live[len(live)-1]
		live = live[:len(live)-1]
	}
	sizes := []int64{256 << 20, 512 << 20, 1 << 30, 2 << 30}
	worst := 0.0
	for step := range steps {
		if len(live) < target || rng.IntN(2) == 0 {
			place(fmt.Sprintf("s-%d", step), sizes[rng.IntN(len(sizes))])
		} else {
			release(rng.IntN(len(live)))
		}
		if len(live) >= target && step%100 == 0 {
			// Load is the tighter of slots and memory in use, as Room weighs it.
			loads := make([]float64, sidecars)
			sum := 0.0
			for i, s := range fleet {
				loads[i] = 1 - Room(s.cap, maxLeases)
				sum += loads[i]
			}
			worst = max(worst, slices.Max(loads)/(sum/sidecars))
		}
	}
	return worst
}
