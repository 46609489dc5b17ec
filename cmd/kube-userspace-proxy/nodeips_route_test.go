package main

import (
	"net/netip"
	"testing"
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
