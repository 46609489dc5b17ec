package main

import (
	"context"
	"net/netip"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/iptables"
)

// A node IP taken from the default route that leaves the node (a DHCP
// lease renumbered from .10 to .11): the portals kept DNATing to .10, and
// every Service of the node was lost while /healthz said 200, with nothing
// logged. Now a second look that finds it gone, with the default route on
// another address, restarts the proxy; gone with none to take, it waits.
func TestRouteIPsWatch(t *testing.T) {
	a := netip.MustParseAddr
	saved := defaultRoutes
	defer func() { defaultRoutes = saved }()
	type look struct {
		local bool   // is the node IP in use still the node's?
		route string // the default route's source now ("" none)
		want  bool   // restart asked for
	}
	for _, tc := range []struct {
		name  string
		v     validated
		looks []look
	}{
		{"renumbered", validated{}, []look{{true, "192.168.77.10", false}, {false, "192.168.77.11", false}, {false, "192.168.77.11", true}}},
		{"gone for a moment", validated{}, []look{{false, "", false}, {true, "192.168.77.10", false}, {false, "192.168.77.11", false}, {true, "192.168.77.10", false}}},
		{"gone with nothing instead", validated{}, []look{{false, "", false}, {false, "", false}, {false, "", false}, {true, "192.168.77.10", false}}},
		{"--node-ip decides it", validated{nodeIP: a("192.168.77.10")}, []look{{false, "192.168.77.11", false}, {false, "192.168.77.11", false}}},
		{"--bind-address decides it", validated{bind: a("192.168.77.10")}, []look{{false, "192.168.77.11", false}, {false, "192.168.77.11", false}}},
		{"the Node decides it", validated{nodeObjectIPs: []netip.Addr{a("192.168.77.10")}}, []look{{false, "192.168.77.11", false}, {false, "192.168.77.11", false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			route := "192.168.77.10"
			defaultRoutes.v4 = func() netip.Addr {
				if route == "" {
					return netip.Addr{}
				}
				return a(route)
			}
			defaultRoutes.v6 = func() netip.Addr { return netip.Addr{} }
			local := true
			var restarts []error
			w := newRouteIPsWatch(&tc.v, func(ip netip.Addr) bool { return local && ip == a("192.168.77.10") }, func(err error) { restarts = append(restarts, err) })
			for i, l := range tc.looks {
				local, route = l.local, l.route
				restarts = nil
				if got := w.look(); got != l.want || (len(restarts) == 1) != l.want {
					t.Fatalf("look %d: restart %v (%v), want %v", i, got, restarts, l.want)
				}
			}
		})
	}
}

// TestRouteIPsWatchTakesAnIPv4NodeIPThatCameLater: an IPv4 default route
// that came only after the start (a DHCP lease late at boot, a start during
// a link flap) left the IPv4 portals on REDIRECT, which loses pods on
// address-less veths, until some other restart (lab: a Calico-shaped pod
// timed out 3 of 3 to a ClusterIP while the proxy ran on). Two looks that
// find one restart the proxy; a flag or the Node deciding IPv4, a route
// seen once, or IPv6 (REDIRECT takes a link-local address there, which
// every IPv6 interface has), do not.
func TestRouteIPsWatchTakesAnIPv4NodeIPThatCameLater(t *testing.T) {
	a := netip.MustParseAddr
	saved := defaultRoutes
	defer func() { defaultRoutes = saved }()
	for _, tc := range []struct {
		name   string
		v      validated
		six    bool     // the family that has no default route at start
		routes []string // its default route's source at start, then at each look ("" none)
		want   bool     // restart at the last look
	}{
		{"appeared", validated{}, false, []string{"", "", "192.168.77.10", "192.168.77.10"}, true},
		{"seen once", validated{}, false, []string{"", "192.168.77.10", "", "192.168.77.10"}, false},
		{"--node-ip decides it", validated{nodeIP: a("192.168.77.20")}, false, []string{"", "192.168.77.10", "192.168.77.10"}, false},
		{"--bind-address decides it", validated{bind: a("fd00::20")}, false, []string{"", "192.168.77.10", "192.168.77.10"}, false},
		{"the Node decides it", validated{nodeObjectIPs: []netip.Addr{a("192.168.77.20")}}, false, []string{"", "192.168.77.10", "192.168.77.10"}, false},
		{"--prerouting-redirect keeps REDIRECT", validated{preroutingRedirect: true}, false, []string{"", "192.168.77.10", "192.168.77.10"}, false},
		{"IPv6", validated{}, true, []string{"", "fd00::10", "fd00::10", "fd00::10"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			route := tc.routes[0]
			late := func() netip.Addr {
				if route == "" {
					return netip.Addr{}
				}
				return a(route)
			}
			defaultRoutes.v4, defaultRoutes.v6 = late, func() netip.Addr { return a("fd00::10") }
			if tc.six {
				defaultRoutes.v4, defaultRoutes.v6 = func() netip.Addr { return a("192.168.77.10") }, late
			}
			var restarts []error
			w := newRouteIPsWatch(&tc.v, func(netip.Addr) bool { return true }, func(err error) { restarts = append(restarts, err) })
			for i, r := range tc.routes[1:] {
				route = r
				got := w.look()
				last := i == len(tc.routes)-2
				if want := last && tc.want; got != want || (len(restarts) == 1) != want {
					t.Fatalf("look %d (route %q): restart %v (%v), want %v", i, r, got, restarts, want)
				}
			}
		})
	}
}

// TestRouteIPsWatchTakesThePortalsNodeIP: the watch compares with the node
// IPs the portals were built with, not with the default route read again
// when it starts. The portals take theirs before start-up waits out an
// xtables lock another process holds (up to lockWait, 20 s: a CNI at
// boot), and an IPv4 lease that came meanwhile (late DHCP at boot, the
// case the watch is for) was taken by the watch as the node IP in use:
// the portals stayed on REDIRECT and nothing restarted them.
func TestRouteIPsWatchTakesThePortalsNodeIP(t *testing.T) {
	saved := defaultRoutes
	defer func() { defaultRoutes = saved }()
	var route netip.Addr // no IPv4 default route at start
	defaultRoutes.v4 = func() netip.Addr { return route }
	defaultRoutes.v6 = func() netip.Addr { return netip.Addr{} }
	runners := map[iptables.Family]iptables.Runner{iptables.IPv4: iptables.NewFakeRunner(iptables.IPv4), iptables.IPv6: iptables.NewFakeRunner(iptables.IPv6)}
	v := &validated{}
	if _, _, err := portalSyncers(context.Background(), v, func(f iptables.Family) (iptables.Runner, error) {
		route = netip.MustParseAddr("192.168.77.10") // the lease, while the lock was waited for
		return runners[f], nil
	}); err != nil {
		t.Fatalf("portalSyncers: %v", err)
	}
	var restarts []error
	w := newRouteIPsWatch(v, func(netip.Addr) bool { return true }, func(err error) { restarts = append(restarts, err) })
	w.look()
	if got := w.look(); !got || len(restarts) != 1 {
		t.Fatalf("portals built without an IPv4 node IP, the route's %v there since: restart %v (%v) after two looks, want true", route, got, restarts)
	}
}
