package main

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/test/harness/netns"
)

// The default route's address is the one the kernel sends from, on node
// shapes where the interface's first address is not: each case is a fresh
// namespace whose uplink is a veth (its peer beside it, for a carrier).
func TestDefaultRouteIPIsTheKernelsSource(t *testing.T) {
	netns.Require(t)
	for _, tc := range []struct {
		name   string
		sysctl [][2]string // key, value: before the ip commands
		setup  [][]string  // ip commands
		six    bool
		want   string
	}{
		{"a VIP listed before the node's address", nil, [][]string{
			{"addr", "add", "198.51.100.50/32", "dev", "up0"},
			{"addr", "add", "192.168.77.11/24", "dev", "up0"},
			{"route", "add", "default", "via", "192.168.77.1"},
		}, false, "192.168.77.11"},
		{"unnumbered: the address on lo, named by the route's src", nil, [][]string{
			{"addr", "add", "10.0.0.5/32", "dev", "lo"},
			{"route", "add", "192.168.77.1", "dev", "up0"},
			{"route", "add", "default", "via", "192.168.77.1", "dev", "up0", "src", "10.0.0.5"},
		}, false, "10.0.0.5"},
		{"plain", nil, [][]string{
			{"addr", "add", "192.168.77.10/24", "dev", "up0"},
			{"route", "add", "default", "via", "192.168.77.1"},
		}, false, "192.168.77.10"},
		{"IPv6: a deprecated address beside the node's", nil, [][]string{
			{"-6", "addr", "add", "fd00:77::10/64", "dev", "up0", "nodad"},
			{"-6", "addr", "add", "fd00:77::99/64", "dev", "up0", "nodad", "preferred_lft", "0", "valid_lft", "600"},
			{"-6", "route", "add", "default", "via", "fd00:77::1"},
		}, true, "fd00:77::10"},
		// RFC 4941 privacy addresses (use_tempaddr 2, Ubuntu's desktop
		// default): the kernel prefers the temporary one, which a day
		// later is deprecated and a week later gone, and the node IP's
		// watch then restarted the proxy; the stable address is the
		// node's.
		{"IPv6: a temporary (privacy) address the kernel prefers", [][2]string{
			{"net.ipv6.conf.up0.use_tempaddr", "2"},
		}, [][]string{
			{"-6", "addr", "add", "fd00:77::10/64", "dev", "up0", "nodad", "mngtmpaddr"},
			{"-6", "route", "add", "default", "via", "fd00:77::1"},
		}, true, "fd00:77::10"},
		{"no default route", nil, [][]string{
			{"addr", "add", "192.168.77.10/24", "dev", "up0"},
		}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := netns.New(t).NS("route")
			ns.MustIP("link", "add", "up0", "type", "veth", "peer", "name", "up0p")
			ns.MustIP("link", "set", "up0", "up")
			ns.MustIP("link", "set", "up0p", "up")
			for _, kv := range tc.sysctl {
				ns.Sysctl(kv[0], kv[1])
			}
			for _, args := range tc.setup {
				ns.MustIP(args...)
			}
			if tc.sysctl != nil {
				waitTemporaryAddress(t, ns)
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

// waitTemporaryAddress waits until up0's privacy address has passed
// duplicate address detection: a tentative one is never a source, and the
// kernel's choice would be the stable one by default.
func waitTemporaryAddress(t *testing.T, ns *netns.NS) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out := ns.MustExec("ip", "-6", "addr", "show", "dev", "up0", "temporary")
		if strings.Contains(out, "temporary") && !strings.Contains(out, "tentative") {
			return
		}
	}
	t.Fatalf("no usable temporary address on up0: %s", ns.MustExec("ip", "-6", "addr", "show", "dev", "up0"))
}
