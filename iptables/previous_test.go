package iptables

import (
	"maps"
	"net/netip"
	"testing"
)

// The proxy port of every portal reads back from the rules Sync wrote,
// bucketed or not, in either family's spelling, DNAT or REDIRECT: from the
// host chain, each address's cluster-wide socket (the externalTrafficPolicy:
// Local shortcut too); from the container chains, each address's and
// NodePort's socket (the node-local one under Local), source-matched
// shortcut rules aside.
func TestProxyPortsInKernel(t *testing.T) {
	v4 := []Portal{
		{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40001},
		{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("203.0.113.7"), Port: 80, ProxyPort: 40001},
		{Name: "default/web:http", Protocol: TCP, Port: 30080, NodePort: true, ProxyPort: 40001},
		{Name: "kube-system/dns:dns", Protocol: UDP, IP: netip.MustParseAddr("10.96.0.53"), Port: 53, ProxyPort: 40002},
		{Name: "default/local:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.11"), Port: 80, ProxyPort: 40003},
		{Name: "default/local:http", Protocol: TCP, IP: netip.MustParseAddr("198.51.100.1"), Port: 80, ProxyPort: 40004, ClusterProxyPort: 40003},
		{Name: "default/local:http", Protocol: TCP, Port: 30083, NodePort: true, ProxyPort: 40004, ClusterProxyPort: 40003},
		// Both traffic policies Local: external clients share the cluster
		// IP's socket, the node and pods meet the cluster-wide one.
		{Name: "default/both:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.12"), Port: 80, ProxyPort: 40006},
		{Name: "default/both:http", Protocol: TCP, IP: netip.MustParseAddr("198.51.100.2"), Port: 80, ProxyPort: 40006, ClusterProxyPort: 40007},
		{Name: "default/both:http", Protocol: TCP, Port: 30082, NodePort: true, ProxyPort: 40006, ClusterProxyPort: 40007},
	}
	want := map[PortalKey]int{
		{"default/web:http", TCP, netip.MustParseAddr("10.96.0.10"), 80}:     40001,
		{"default/web:http", TCP, netip.MustParseAddr("203.0.113.7"), 80}:    40001,
		{"kube-system/dns:dns", UDP, netip.MustParseAddr("10.96.0.53"), 53}:  40002,
		{"default/local:http", TCP, netip.MustParseAddr("10.96.0.11"), 80}:   40003,
		{"default/local:http", TCP, netip.MustParseAddr("198.51.100.1"), 80}: 40003,
		{"default/local:http", TCP, netip.Addr{}, 30083}:                     40003,
		{"default/web:http", TCP, netip.Addr{}, 30080}:                       40001,
		{"default/both:http", TCP, netip.MustParseAddr("10.96.0.12"), 80}:    40006,
		{"default/both:http", TCP, netip.MustParseAddr("198.51.100.2"), 80}:  40007,
		{"default/both:http", TCP, netip.Addr{}, 30082}:                      40007,
	}
	wantContainer := map[PortalKey]int{
		{"default/web:http", TCP, netip.MustParseAddr("10.96.0.10"), 80}:     40001,
		{"default/web:http", TCP, netip.MustParseAddr("203.0.113.7"), 80}:    40001,
		{"default/web:http", TCP, netip.Addr{}, 30080}:                       40001,
		{"kube-system/dns:dns", UDP, netip.MustParseAddr("10.96.0.53"), 53}:  40002,
		{"default/local:http", TCP, netip.MustParseAddr("10.96.0.11"), 80}:   40003,
		{"default/local:http", TCP, netip.MustParseAddr("198.51.100.1"), 80}: 40004,
		{"default/local:http", TCP, netip.Addr{}, 30083}:                     40004,
		{"default/both:http", TCP, netip.MustParseAddr("10.96.0.12"), 80}:    40006,
		{"default/both:http", TCP, netip.MustParseAddr("198.51.100.2"), 80}:  40006,
		{"default/both:http", TCP, netip.Addr{}, 30082}:                      40006,
	}
	v6 := []Portal{
		{Name: "default/web6:http", Protocol: TCP, IP: netip.MustParseAddr("fd00::10"), Port: 80, ProxyPort: 40005},
		{Name: "default/web6:http", Protocol: TCP, Port: 30081, NodePort: true, ProxyPort: 40005},
	}
	want6 := map[PortalKey]int{
		{"default/web6:http", TCP, netip.MustParseAddr("fd00::10"), 80}: 40005,
		{"default/web6:http", TCP, netip.Addr{}, 30081}:                 40005,
	}
	// The IPv6 NodePort rule's "! -d ::1/128" is no service address.
	wantContainer6 := map[PortalKey]int{
		{"default/web6:http", TCP, netip.MustParseAddr("fd00::10"), 80}: 40005,
		{"default/web6:http", TCP, netip.Addr{}, 30081}:                 40005,
	}
	withCIDR := testConfig
	withCIDR.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	withCIDR.NodePortAddresses = []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}
	redirect := testConfig
	redirect.NodeIP = netip.Addr{}
	for _, tc := range []struct {
		name        string
		family      Family
		cfg         Config
		bucketAbove int
		portals     []Portal
		host        map[PortalKey]int
		container   map[PortalKey]int
	}{
		{"DNAT to the node IP", IPv4, testConfig, defaultBucketAbove, v4, want, wantContainer},
		{"bucketed", IPv4, testConfig, 1, v4, want, wantContainer},
		{"no node IP", IPv4, redirect, defaultBucketAbove, v4, want, wantContainer},
		{"cluster and NodePort CIDRs", IPv4, withCIDR, defaultBucketAbove, v4, want, wantContainer},
		{"IPv6", IPv6, Config{Family: IPv6, BindAddress: netip.IPv6Unspecified(), NodeIP: netip.MustParseAddr("fd00::1")}, defaultBucketAbove, v6, want6, wantContainer6},
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
			if !maps.Equal(got.Host, tc.host) {
				t.Errorf("host %v\nwant %v", got.Host, tc.host)
			}
			if !maps.Equal(got.Container, tc.container) {
				t.Errorf("container %v\nwant %v", got.Container, tc.container)
			}
		})
	}
}

func TestParsePortalRule(t *testing.T) {
	ip := netip.MustParseAddr("10.96.0.10")
	key := PortalKey{"default/web:http", TCP, ip, 80}
	for _, tc := range []struct {
		rule string
		want portalRule
		ok   bool
	}{
		{`-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j DNAT --to-destination 192.168.1.10:40001`,
			portalRule{key: key, port: 40001}, true},
		{`-d fd00::10/128 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j DNAT --to-destination [fd00::1]:40001`,
			portalRule{key: PortalKey{"default/web:http", TCP, netip.MustParseAddr("fd00::10"), 80}, port: 40001}, true},
		{`-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j REDIRECT --to-ports 40001`,
			portalRule{key: key, port: 40001}, true},
		{`-s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j DNAT --to-destination 192.168.1.10:40001`,
			portalRule{key: key, port: 40001, fromSource: true}, true},
		{`-d 192.168.1.0/24 -p tcp -m comment --comment "default/web:http" -m tcp --dport 30080 -j DNAT --to-destination 192.168.1.10:40001`,
			portalRule{key: PortalKey{"default/web:http", TCP, netip.Addr{}, 30080}, port: 40001, dstCIDR: true}, true},
		{`-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp ! --dport 80 -j DNAT --to-destination 192.168.1.10:40001`,
			portalRule{key: key, port: 40001, fromSource: true}, true},
		{`-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http" -m tcp --dport 80 -j ACCEPT`, portalRule{}, false},
		{`-d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REDIRECT --to-ports 70000`, portalRule{}, false},
		{`-d 10.96.0.10/32 -p tcp -m comment --comment "default/web:http -j DNAT`, portalRule{}, false},
	} {
		got, ok := parsePortalRule(tc.rule)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%s:\n got %+v %v\nwant %+v %v", tc.rule, got, ok, tc.want, tc.ok)
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
	if len(got.Host) != 0 {
		t.Errorf("host %v, want nothing", got.Host)
	}
}

// The Sync right after ProxyPortsInKernel works from its dump (one
// iptables-save for both) and still repairs what differs; an Update in
// between drops the dump, so the next Sync reads the kernel again.
func TestSyncReusesTheKeptPortsDump(t *testing.T) {
	portals := []Portal{{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40001}}
	fake := NewFakeRunner(IPv4)
	syncOK(t, New(fake, testConfig), portals)

	saves := func() int { return fake.CallsOf("Save") }
	r := New(fake, testConfig)
	fake.ResetCalls()
	if _, err := r.ProxyPortsInKernel(); err != nil {
		t.Fatal(err)
	}
	moved := []Portal{portals[0]}
	moved[0].ProxyPort = 40002
	syncOK(t, r, moved)
	if n := saves(); n != 1 {
		t.Errorf("%d dumps for ProxyPortsInKernel and the Sync after it, want 1", n)
	}
	assertState(t, fake, r, moved)

	fake.ResetCalls()
	if _, err := r.ProxyPortsInKernel(); err != nil {
		t.Fatal(err)
	}
	if err := r.Update(portals); err != nil {
		t.Fatal(err)
	}
	syncOK(t, r, portals)
	if n := saves(); n != 2 {
		t.Errorf("%d dumps with an Update between, want 2 (the Sync reads its own)", n)
	}
	// With the old dump (40002) the Sync would rewrite what the Update
	// just wrote.
	if w := fake.Writes(); len(w) != 1 {
		t.Errorf("%d writes, want the Update's alone:\n%s", len(w), w)
	}
	assertState(t, fake, r, portals)
}
