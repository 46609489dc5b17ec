package main

import (
	"net/netip"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// The default route's address is the one the kernel sends from, on node
// shapes where the interface's first address is not: each case is a fresh
// namespace whose uplink is a veth (its peer beside it, for a carrier).
func TestDefaultRouteIPIsTheKernelsSource(t *testing.T) {
	netns.Require(t)
	for _, tc := range []struct {
		name  string
		setup [][]string // ip commands
		six   bool
		want  string
	}{
		{"a VIP listed before the node's address", [][]string{
			{"addr", "add", "198.51.100.50/32", "dev", "up0"},
			{"addr", "add", "192.168.77.11/24", "dev", "up0"},
			{"route", "add", "default", "via", "192.168.77.1"},
		}, false, "192.168.77.11"},
		{"unnumbered: the address on lo, named by the route's src", [][]string{
			{"addr", "add", "10.0.0.5/32", "dev", "lo"},
			{"route", "add", "192.168.77.1", "dev", "up0"},
			{"route", "add", "default", "via", "192.168.77.1", "dev", "up0", "src", "10.0.0.5"},
		}, false, "10.0.0.5"},
		{"plain", [][]string{
			{"addr", "add", "192.168.77.10/24", "dev", "up0"},
			{"route", "add", "default", "via", "192.168.77.1"},
		}, false, "192.168.77.10"},
		{"IPv6: a deprecated address beside the node's", [][]string{
			{"-6", "addr", "add", "fd00:77::10/64", "dev", "up0", "nodad"},
			{"-6", "addr", "add", "fd00:77::99/64", "dev", "up0", "nodad", "preferred_lft", "0", "valid_lft", "600"},
			{"-6", "route", "add", "default", "via", "fd00:77::1"},
		}, true, "fd00:77::10"},
		{"no default route", [][]string{
			{"addr", "add", "192.168.77.10/24", "dev", "up0"},
		}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := netns.New(t).NS("route")
			ns.MustIP("link", "add", "up0", "type", "veth", "peer", "name", "up0p")
			ns.MustIP("link", "set", "up0", "up")
			ns.MustIP("link", "set", "up0p", "up")
			for _, args := range tc.setup {
				ns.MustIP(args...)
			}
			var got netip.Addr
			if err := ns.Do(func() error {
				if tc.six {
					got = defaultRouteIP6()
				} else {
					got = defaultRouteIP()
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			want := netip.Addr{}
			if tc.want != "" {
				want = netip.MustParseAddr(tc.want)
			}
			if got != want {
				t.Errorf("default route IP %v, want %v", got, want)
			}
		})
	}
}
