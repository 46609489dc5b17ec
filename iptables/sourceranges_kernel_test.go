package iptables

import (
	"net"
	"net/netip"
	"testing"
)

// TestKernelLBSourceRanges proves loadBalancerSourceRanges with real
// traffic inside a namespace: the node's own connections to a LoadBalancer
// IP, each from a chosen source address, are served from an allowed range
// and dropped from any other, while the ClusterIP on the same proxy socket
// serves every source; for TCP and UDP. The rules also read back exactly as
// rendered (an unchanged sync writes nothing).
func TestKernelLBSourceRanges(t *testing.T) {
	requireRealIptables(t)
	ns, runner := nodeNamespace(t)
	for _, a := range []string{"10.1.0.5/32", "10.2.0.5/32"} {
		inNetns(t, ns, "ip", "addr", "add", a, "dev", "kup0")
	}
	inNetns(t, ns, "ip", "route", "add", "198.51.100.0/24", "dev", "kup0")
	tcpPort := answerTCP(t, runner, "0.0.0.0:0").Addr().(*net.TCPAddr).Port
	// On the node IP, the portals' DNAT target: a socket on every address
	// answers a client on 10.1.0.5 from 10.1.0.5, which conntrack cannot
	// match to the DNATed flow.
	udpPort := answerUDP(t, runner, "10.200.0.1:0").LocalAddr().(*net.UDPAddr).Port

	allowed := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00:10::/64")}
	lb := netip.MustParseAddr("198.51.100.20")
	portals := []Portal{
		{Name: "default/lb:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: tcpPort},
		{Name: "default/lb:http", Protocol: TCP, IP: lb, Port: 80, ProxyPort: tcpPort, SourceRanges: allowed},
		{Name: "default/lb:dns", Protocol: UDP, IP: netip.MustParseAddr("10.96.0.10"), Port: 53, ProxyPort: udpPort},
		{Name: "default/lb:dns", Protocol: UDP, IP: lb, Port: 53, ProxyPort: udpPort, SourceRanges: allowed},
	}
	cfg := Config{Family: IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: netip.MustParseAddr("10.200.0.1")}
	r := New(runner, cfg)
	syncOK(t, r, portals)
	assertKernelState(t, ns, r, portals)
	runner.restores.Store(0)
	syncOK(t, r, portals)
	if n := runner.restores.Load(); n != 0 || len(r.printed) != 0 {
		t.Errorf("unchanged sync ran %d restores (kernel printed differently: %+v), want 0", n, r.printed)
	}
	// IPv6: the same rules read back as ip6tables-save prints them (no
	// traffic: the IPv4 half above proves what they do).
	runner6 := newNSRunner(t, ns, IPv6)
	v6 := []Portal{{Name: "default/lb:http", Protocol: TCP, IP: netip.MustParseAddr("fd00:96::20"), Port: 80, ProxyPort: tcpPort,
		SourceRanges: []netip.Prefix{netip.MustParsePrefix("fd00:10::/64"), netip.MustParsePrefix("fd00:200::/64")}}}
	r6 := New(runner6, Config{Family: IPv6, NodeIP: netip.MustParseAddr("fd00:200::1")})
	syncOK(t, r6, v6)
	assertKernelState(t, ns, r6, v6)
	runner6.restores.Store(0)
	syncOK(t, r6, v6)
	if n := runner6.restores.Load(); n != 0 || len(r6.printed) != 0 {
		t.Errorf("IPv6: unchanged sync ran %d restores (kernel printed differently: %+v), want 0", n, r6.printed)
	}
	if rules := r6.desired(v6)[ChainLBSourceRanges]; len(rules) != 4 {
		t.Errorf("IPv6 source-range rules %q, want 2 ranges, the LB IP (the node IP is in a range) and the drop", rules)
	}

	tests := []struct {
		name, network, from, to string
		served                  bool
	}{
		{"LB IP from an allowed range", "tcp4", "10.1.0.5", "198.51.100.20:80", true},
		{"LB IP from outside the ranges", "tcp4", "10.2.0.5", "198.51.100.20:80", false},
		{"LB IP from the node IP, outside the ranges", "tcp4", "10.200.0.1", "198.51.100.20:80", false},
		{"ClusterIP from outside the ranges", "tcp4", "10.2.0.5", "10.96.0.10:80", true},
		{"UDP LB IP from an allowed range", "udp4", "10.1.0.5", "198.51.100.20:53", true},
		{"UDP LB IP from outside the ranges", "udp4", "10.2.0.5", "198.51.100.20:53", false},
		{"UDP ClusterIP from outside the ranges", "udp4", "10.2.0.5", "10.96.0.10:53", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if served := dialServedFrom(runner, tt.network, netip.AddrPortFrom(netip.MustParseAddr(tt.from), 0), tt.to); served != tt.served {
				t.Errorf("from %s to %s: served=%v, want %v", tt.from, tt.to, served, tt.served)
			}
		})
	}

	// Control: without the chain's rules the refused source gets through,
	// so the drop above is theirs and not a routing accident.
	inNetns(t, ns, "iptables", "-t", "filter", "-F", ChainLBSourceRanges)
	if !dialServedFrom(runner, "tcp4", netip.AddrPortFrom(netip.MustParseAddr("10.2.0.5"), 0), "198.51.100.20:80") {
		t.Error("without the source-range rules the LB IP was not served from 10.2.0.5")
	}
}
