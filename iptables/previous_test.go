package iptables

import (
	"maps"
	"net/netip"
	"testing"
)

// The proxy port of every ClusterIP, externalIP and LB-IP portal reads back
// from the rules Sync wrote, bucketed or not, in either family's spelling,
// DNAT or REDIRECT; NodePorts (no address) and the externalTrafficPolicy:
// Local socket (the host chain points at the cluster-wide one) are not
// portals of their own socket there.
func TestProxyPortsInKernel(t *testing.T) {
	v4 := []Portal{
		{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40001},
		{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("203.0.113.7"), Port: 80, ProxyPort: 40001},
		{Name: "default/web:http", Protocol: TCP, Port: 30080, NodePort: true, ProxyPort: 40001},
		{Name: "kube-system/dns:dns", Protocol: UDP, IP: netip.MustParseAddr("10.96.0.53"), Port: 53, ProxyPort: 40002},
		{Name: "default/local:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.11"), Port: 80, ProxyPort: 40003},
		{Name: "default/local:http", Protocol: TCP, IP: netip.MustParseAddr("198.51.100.1"), Port: 80, ProxyPort: 40004, ClusterProxyPort: 40003},
	}
	want := map[PortalKey]int{
		{"default/web:http", TCP, netip.MustParseAddr("10.96.0.10"), 80}:     40001,
		{"default/web:http", TCP, netip.MustParseAddr("203.0.113.7"), 80}:    40001,
		{"kube-system/dns:dns", UDP, netip.MustParseAddr("10.96.0.53"), 53}:  40002,
		{"default/local:http", TCP, netip.MustParseAddr("10.96.0.11"), 80}:   40003,
		{"default/local:http", TCP, netip.MustParseAddr("198.51.100.1"), 80}: 40003,
	}
	v6 := []Portal{{Name: "default/web6:http", Protocol: TCP, IP: netip.MustParseAddr("fd00::10"), Port: 80, ProxyPort: 40005}}
	want6 := map[PortalKey]int{{"default/web6:http", TCP, netip.MustParseAddr("fd00::10"), 80}: 40005}
	redirect := testConfig
	redirect.NodeIP = netip.Addr{}
	for _, tc := range []struct {
		name        string
		family      Family
		cfg         Config
		bucketAbove int
		portals     []Portal
		want        map[PortalKey]int
	}{
		{"DNAT to the node IP", IPv4, testConfig, defaultBucketAbove, v4, want},
		{"bucketed", IPv4, testConfig, 1, v4, want},
		{"no node IP", IPv4, redirect, defaultBucketAbove, v4, want},
		{"IPv6", IPv6, Config{Family: IPv6, BindAddress: netip.IPv6Unspecified(), NodeIP: netip.MustParseAddr("fd00::1")}, defaultBucketAbove, v6, want6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := NewFakeRunner(tc.family)
			r := New(fake, tc.cfg)
			r.bucketAbove = tc.bucketAbove
			syncOK(t, r, tc.portals)
			// A proxy started later reads them with Rules of its own.
			got, err := New(fake, tc.cfg).ProxyPortsInKernel()
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("got %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestPortalProxyPortRules(t *testing.T) {
	key := PortalKey{"default/web:http", TCP, netip.MustParseAddr("10.96.0.10"), 80}
	for _, tc := range []struct {
		rule string
		port int // 0: not read
	}{
		{`-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j DNAT --to-destination 192.168.1.10:40001`, 40001},
		{`-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j REDIRECT --to-ports 40001`, 40001},
		{`-s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j DNAT --to-destination 192.168.1.10:40001`, 0},
		{`-d 10.96.0.0/16 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j DNAT --to-destination 192.168.1.10:40001`, 0},
		{`-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j ACCEPT`, 0},
		{`-d 10.96.0.10/32 -p sctp -m comment --comment "default/web:http" -m sctp --dport 80 -j DNAT --to-destination 192.168.1.10:40001`, 0},
		{`-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp ! --dport 80 -j DNAT --to-destination 192.168.1.10:40001`, 0},
		{`-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http -j DNAT`, 0},
	} {
		got, port, ok := portalProxyPort(tc.rule)
		if ok != (tc.port != 0) || (ok && (port != tc.port || got != key)) {
			t.Errorf("%s: %v %d %v, want port %d", tc.rule, got, port, ok, tc.port)
		}
	}
}

// Two rules of one portal that name different ports leave it out: which
// socket it had is unknown.
func TestProxyPortsInKernelDisagreeing(t *testing.T) {
	fake := NewFakeRunner(IPv4)
	r := New(fake, testConfig)
	ip := netip.MustParseAddr("10.96.0.10")
	syncOK(t, r, []Portal{{Name: "default/web:http", Protocol: TCP, IP: ip, Port: 80, ProxyPort: 40001}})
	if err := fake.Restore([]byte("*nat\n-A KUBE-PORTALS-HOST -d 10.96.0.10/32 -p tcp -m comment --comment \"default/web:http\" -m tcp --dport 80 -j DNAT --to-destination 192.168.1.10:40009\nCOMMIT\n")); err != nil {
		t.Fatal(err)
	}
	got, err := r.ProxyPortsInKernel()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Errorf("got %v, want nothing", got)
	}
}
