package proxier

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/internal/mono"
	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// An endpoint on a NodePort's number is one of the proxy's own portals
// only where the NodePort rules would take the node's dial to it: not at
// IPv6's ::1 (the rules leave it out, `! -d ::1/128`), not at a node
// address outside --nodeport-addresses, and not in a family the Service
// has no NodePort rule in. Each was refused as a loop ("one of this
// proxy's own portals") though its dial met no rule of ours.
func TestOwnPortalsNodePortsAsTheRulesTakeThem(t *testing.T) {
	ap := netip.MustParseAddrPort
	node4, node4b, node6 := "192.0.2.5", "198.51.100.5", "fd00:1::5"
	restrict := []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("fd00:1::/64")}
	dualStack := func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }
	for _, c := range []struct {
		name     string
		restrict bool
		dual     bool
		captured map[string]bool
	}{
		{"every address", false, true, map[string]bool{
			"127.0.0.1:30080": true, node4 + ":30080": true, node4b + ":30080": true,
			"[" + node6 + "]:30080": true, "[::1]:30080": false, "10.244.0.7:30080": false,
		}},
		{"--nodeport-addresses", true, true, map[string]bool{
			"127.0.0.1:30080": false, node4 + ":30080": true, node4b + ":30080": false,
			"[" + node6 + "]:30080": true, "[::1]:30080": false,
		}},
		{"IPv4-only Service", false, false, map[string]bool{
			"127.0.0.1:30080": true, node4 + ":30080": true, "[" + node6 + "]:30080": false, "[::1]:30080": false,
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var cfg4, cfg6 iptables.Config
			cfg4.Family, cfg6.Family = iptables.IPv4, iptables.IPv6
			if c.restrict {
				cfg4.NodePortAddresses, cfg6.NodePortAddresses = restrict, restrict
			}
			p := newTestProxier(t, Options{
				IPv4Portals: iptables.New(iptables.NewFakeRunner(iptables.IPv4), cfg4),
				IPv6Portals: iptables.New(iptables.NewFakeRunner(iptables.IPv6), cfg6),
			})
			opts := []svcOpt{withNodePort(30080)}
			if c.dual {
				opts = append(opts, dualStack)
			}
			p.OnServiceAdd(makeService("np", opts...))
			p.Sync()
			own := p.sockCfg.ownPortals
			own.local.Store(&localAddrs{at: mono.Now(), addrs: []netip.Addr{
				netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr(node4), netip.MustParseAddr(node4b),
				netip.IPv6Loopback(), netip.MustParseAddr(node6)}})
			for ep, want := range c.captured {
				if got := own.captures(iptables.TCP, ap(ep)); got != want {
					t.Errorf("endpoint %s: captured %v, want %v (the NodePort rules take it: %v)", ep, got, want, want)
				}
			}
			outside := ap(node4b + ":30080")
			if allocs := testing.AllocsPerRun(100, func() { own.captures(iptables.TCP, outside) }); allocs != 0 {
				t.Errorf("%v allocations per dial of an endpoint on a NodePort's number, want none", allocs)
			}
		})
	}
}

// The own-portal set follows the rules as written: after a failed write
// the kernel may still hold the portals it was to remove (so a dial to
// one still loops) and may already hold those it was to add, so both are
// refused until a write goes through, which leaves only what it wrote.
// Before, the set took the sync's portals before the write: a removed
// portal's address was dialled while the kernel still captured it.
func TestOwnPortalsFollowTheWrittenRules(t *testing.T) {
	ap := netip.MustParseAddrPort
	syncer := &switchSyncer{}
	p := newTestProxier(t, Options{IPv4Portals: syncer})
	p.OnServiceAdd(makeService("old", withExternalIPPort("192.0.2.10", 80)))
	p.Sync()
	own := p.sockCfg.ownPortals
	if !own.captures(iptables.TCP, ap("192.0.2.10:80")) {
		t.Fatal("a written portal is not captured")
	}
	syncer.failing.Store(true)
	p.OnServiceDelete(makeService("old", withExternalIPPort("192.0.2.10", 80)))
	p.OnServiceAdd(makeService("new", withClusterIP("10.96.0.11"), withExternalIPPort("192.0.2.20", 80)))
	p.Sync()
	if !own.captures(iptables.TCP, ap("192.0.2.10:80")) {
		t.Error("after a failed write: the portal it was to remove, still in the kernel, is not captured")
	}
	if !own.captures(iptables.TCP, ap("192.0.2.20:80")) {
		t.Error("after a failed write: the portal it was to add, maybe in the kernel, is not captured")
	}
	syncer.failing.Store(false)
	p.Sync()
	if own.captures(iptables.TCP, ap("192.0.2.10:80")) || !own.captures(iptables.TCP, ap("192.0.2.20:80")) {
		t.Error("after a good write: the set does not hold exactly what it wrote")
	}
}

// A family without rules (no syncer: --bind-address of the other family)
// captures nothing: its portals were in the set though no rule took them.
func TestOwnPortalsOfAFamilyWithoutRules(t *testing.T) {
	p := newTestProxier(t, Options{IPv4Portals: okSyncer{}})
	p.OnServiceAdd(makeService("dual", func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }))
	p.Sync()
	own := p.sockCfg.ownPortals
	if !own.captures(iptables.TCP, netip.MustParseAddrPort("10.96.0.10:80")) {
		t.Error("the IPv4 portal is not captured")
	}
	if own.captures(iptables.TCP, netip.MustParseAddrPort("[fd00::10]:80")) {
		t.Error("the IPv6 portal, which no rule writes, is captured")
	}
}
