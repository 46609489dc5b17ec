package iptables

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// Through the real iptables-restore of each family (ip6tables included),
// random Updates move the chains in and out of buckets (new bucket chains
// declared in the same restore as the parent's jumps to them, unwanted ones
// flushed and deleted after the parent's rewrite), leaving exactly the
// desired rules after every step; a restarted process with the other
// layout (an upgrade that splits chains, or the way back) converges with
// its first Sync; Cleanup removes the buckets too.
func TestKernelBucketsThroughUpdateBothFamilies(t *testing.T) {
	requireRealIptables(t)
	for _, f := range []Family{IPv4, IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ns := newNetns(t)
			runner := newNSRunner(t, ns, f)
			cfg := Config{Family: f, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("192.168.1.10"),
				ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
			addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}) }
			if f == IPv6 {
				cfg.BindAddress, cfg.NodeIP = netip.IPv6Unspecified(), netip.MustParseAddr("fd00:1::10")
				cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("fd01::/48")}
				addr = func(i int) netip.Addr { return netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(i + 1)}) }
			}
			var pool []Portal
			for i := range 12 {
				name := fmt.Sprintf("ns/svc-%d:p", i)
				pool = append(pool,
					Portal{Name: name, Protocol: TCP, IP: addr(i), Port: 80, ProxyPort: 40000 + i},
					Portal{Name: name, Protocol: UDP, Port: 30000 + i, NodePort: true, ProxyPort: 41000 + i},
					Portal{Name: name, Protocol: TCP, IP: addr(100 + i%3), Port: 443, ProxyPort: 42000 + i, ClusterProxyPort: 40000 + i})
			}
			r := New(runner, cfg)
			r.bucketAbove = 8
			rng := rand.New(rand.NewPCG(5, uint64(f)))
			// The set is a prefix of a shuffled pool whose length rises
			// to 24 and falls to 3 by one to three portals a step, with
			// now and then two portals swapped: small deltas that cross
			// bucketAbove both ways.
			perm := rng.Perm(len(pool))
			var portals []Portal
			moves, was, k, up := 0, false, 0, true
			for step := range 60 {
				if d := 1 + rng.IntN(3); up {
					k = min(k+d, len(pool))
				} else {
					k = max(k-d, 0)
				}
				if k >= 24 || k <= 3 {
					up = k <= 3
				}
				if rng.IntN(3) == 0 {
					i, j := rng.IntN(len(pool)), rng.IntN(len(pool))
					perm[i], perm[j] = perm[j], perm[i]
				}
				portals = portals[:0:0]
				for _, i := range perm[:k] {
					portals = append(portals, pool[i])
				}
				if err := r.Update(portals); err != nil {
					t.Fatalf("step %d: Update: %v", step, err)
				}
				assertKernelState(t, ns, r, portals)
				if t.Failed() {
					t.Fatalf("step %d", step)
				}
				if now := hasChain(r.desired(portals), bucketChain(ChainPortalsContainer, 0)); now != was {
					moves, was = moves+1, now
				}
			}
			t.Logf("chains moved in or out of buckets %d times", moves)
			if moves < 3 {
				t.Errorf("chains moved in or out of buckets %d times in 60 steps; want 3 or more", moves)
			}
			// Restarts: bucketed chains found by a process that would not
			// split them, and unbucketed ones by one that would.
			for _, above := range []int{defaultBucketAbove, 8, defaultBucketAbove} {
				restarted := New(runner, cfg)
				restarted.bucketAbove = above
				syncOK(t, restarted, pool)
				assertKernelState(t, ns, restarted, pool)
			}
			if err := Cleanup(runner); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			assertKernelClean(t, ns)
		})
	}
}
