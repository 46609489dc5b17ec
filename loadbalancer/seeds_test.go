package loadbalancer

import (
	"net/netip"
	"slices"
	"testing"
	"time"
)

// The tests in this file replay the experiments of seed 000 (ClientIP
// session affinity measured on a real cluster) against the balancer. Where
// the kernel's iptables mode picks at random, our round robin is exact, so
// the expected figures are the deterministic ones (10/10/10, not 11/10/9).

// countsDesc returns how many picks each endpoint got, largest first.
func countsDesc(eps []netip.AddrPort) []int {
	byEP := map[netip.AddrPort]int{}
	for _, ep := range eps {
		byEP[ep]++
	}
	counts := make([]int, 0, len(byEP))
	for _, n := range byEP {
		counts = append(counts, n)
	}
	slices.Sort(counts)
	slices.Reverse(counts)
	return counts
}

func TestSeedDistribution(t *testing.T) {
	tests := []struct {
		name    string
		policy  AffinityPolicy
		clients []netip.Addr
		// want is, per client, its 30 connections counted per endpoint.
		want [][]int
		// wantDistinctPins: with affinity, whether the clients' endpoints differ
		// (round robin pins successive new clients to successive endpoints).
		wantDistinctPins bool
	}{
		{
			name:    "plain (None): 30 connections over 3 endpoints",
			policy:  AffinityPolicy{},
			clients: []netip.Addr{clientA},
			want:    [][]int{{10, 10, 10}},
		},
		{
			name:    "sticky (ClientIP, default timeout): 30 on one endpoint",
			policy:  AffinityPolicy{ClientIP: true},
			clients: []netip.Addr{clientA},
			want:    [][]int{{30}},
		},
		{
			name:             "two clients pinned independently",
			policy:           AffinityPolicy{ClientIP: true},
			clients:          []netip.Addr{clientA, clientB},
			want:             [][]int{{30}, {30}},
			wantDistinctPins: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, clk := newTestBalancer(t)
			svc := svcName("seed")
			lb.SetAffinity(svc, tt.policy)
			lb.SetEndpoints(svc, readyEndpoints(3))
			sp := lb.ServicePort(svc)

			got := make([][]netip.AddrPort, len(tt.clients))
			for range 30 { // clients interleaved, as two shells looping would be
				for c, client := range tt.clients {
					got[c] = append(got[c], mustNext(t, sp, client, false))
				}
				clk.SetTime(clk.Now().Add(100 * time.Millisecond))
			}
			for c := range tt.clients {
				if counts := countsDesc(got[c]); !slices.Equal(counts, tt.want[c]) {
					t.Errorf("client %v: per-endpoint counts %v, want %v", tt.clients[c], counts, tt.want[c])
				}
			}
			if tt.wantDistinctPins && got[0][0] == got[1][0] {
				t.Errorf("both clients pinned to %v, want independent pins", got[0][0])
			}
		})
	}
}

func TestSeedTimeoutTrials(t *testing.T) {
	const timeout = 3 * time.Second
	tests := []struct {
		name     string
		trials   int
		accesses int           // per trial
		gap      time.Duration // between accesses of a trial
		// wantSticky is how many trials saw one endpoint for all accesses.
		// With round robin over 3 endpoints and one client, an expired entry
		// is re-picked onto the next endpoint, so a re-pick always moves
		// (the seed's random kernel pick moved 8/12 times).
		wantSticky int
	}{
		{name: "1 s apart at timeout 3 s: sticks", trials: 12, accesses: 2, gap: time.Second, wantSticky: 12},
		{name: "4 s apart at timeout 3 s: re-picked", trials: 12, accesses: 2, gap: 4 * time.Second, wantSticky: 0},
		{name: "exactly 3 s apart: re-picked (legacy >=)", trials: 12, accesses: 2, gap: 3 * time.Second, wantSticky: 0},
		{name: "every 2 s, 7 times: each use refreshes, one endpoint", trials: 1, accesses: 7, gap: 2 * time.Second, wantSticky: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, clk := newTestBalancer(t)
			svc := svcName("seed-timeout")
			lb.SetAffinity(svc, clientIPPolicy(timeout))
			lb.SetEndpoints(svc, readyEndpoints(3))
			sp := lb.ServicePort(svc)

			sticky := 0
			for trial := range tt.trials {
				clk.SetTime(clk.Now().Add(time.Minute)) // each trial starts unpinned
				var seen []netip.AddrPort
				for a := range tt.accesses {
					if a > 0 {
						clk.SetTime(clk.Now().Add(tt.gap))
					}
					seen = append(seen, mustNext(t, sp, clientA, false))
					assertPinnedNow(t, lb, svc, clientA, seen[a], clk.Now())
				}
				if len(countsDesc(seen)) == 1 {
					sticky++
				} else if seen[0] == seen[1] {
					t.Errorf("trial %d: re-pick kept %v, want round robin to move on", trial, seen[0])
				}
			}
			if sticky != tt.wantSticky {
				t.Errorf("%d/%d trials stuck to one endpoint, want %d", sticky, tt.trials, tt.wantSticky)
			}
		})
	}
}

// assertPinnedNow checks that the affinity table records client on ep with a
// last use of now: a refresh and a re-pick both (over)write the entry.
func assertPinnedNow(t *testing.T, lb *LoadBalancer, svc ServicePortName, client netip.Addr, ep netip.AddrPort, now time.Time) {
	t.Helper()
	snap, ok := lb.Snapshot(svc)
	if !ok {
		t.Fatalf("no snapshot for %v", svc)
	}
	for _, e := range snap.Clients {
		if e.ClientIP == client {
			if e.Endpoint != ep || !e.LastUsed.Equal(now) {
				t.Errorf("entry for %v = %v at %v, want %v at %v", client, e.Endpoint, e.LastUsed, ep, now)
			}
			return
		}
	}
	t.Errorf("no affinity entry for %v", client)
}

func TestSeedPinnedEndpointRemoved(t *testing.T) {
	tests := []struct {
		name string
		// remove picks, from the three endpoints, the ones to delete given
		// the client's pinned endpoint.
		remove     func(pinned netip.AddrPort) []netip.AddrPort
		wantRepins bool
	}{
		{
			name:       "pinned endpoint deleted: re-pinned to a survivor",
			remove:     func(pinned netip.AddrPort) []netip.AddrPort { return []netip.AddrPort{pinned} },
			wantRepins: true,
		},
		{
			name: "another endpoint deleted: pin kept",
			remove: func(pinned netip.AddrPort) []netip.AddrPort {
				if pinned == backend(1) {
					return []netip.AddrPort{backend(2)}
				}
				return []netip.AddrPort{backend(1)}
			},
			wantRepins: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lb, clk := newTestBalancer(t)
			svc := svcName("seed-delete")
			lb.SetAffinity(svc, AffinityPolicy{ClientIP: true})
			lb.SetEndpoints(svc, readyEndpoints(3))
			sp := lb.ServicePort(svc)
			pinned := mustNext(t, sp, clientA, false)

			gone := tt.remove(pinned)
			var survivors []Endpoint
			for _, e := range readyEndpoints(3) {
				if !slices.Contains(gone, e.Addr) {
					survivors = append(survivors, e)
				}
			}
			lb.SetEndpoints(svc, survivors)
			clk.SetTime(clk.Now().Add(time.Second))

			after := picks(t, sp, clientA, 10)
			if counts := countsDesc(after); !slices.Equal(counts, []int{10}) {
				t.Fatalf("after deletion client spread over endpoints %v, want all 10 on one", counts)
			}
			if slices.Contains(gone, after[0]) {
				t.Errorf("client sent to deleted endpoint %v", after[0])
			}
			if repinned := after[0] != pinned; repinned != tt.wantRepins {
				t.Errorf("re-pinned = %v (from %v to %v), want %v", repinned, pinned, after[0], tt.wantRepins)
			}
		})
	}
}
