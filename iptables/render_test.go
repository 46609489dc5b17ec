package iptables

import (
	"bytes"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current rendering")

// webPortals is a Service with a ClusterIP, an externalIP, a LoadBalancer
// ingress IP and a NodePort, all served by one proxy port, plus DNS on UDP
// and TCP.
func webPortals() []Portal {
	return []Portal{
		{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40001},
		{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("203.0.113.7"), Port: 80, ProxyPort: 40001},
		{Name: "default/web:http", Protocol: TCP, IP: netip.MustParseAddr("198.51.100.20"), Port: 80, ProxyPort: 40001},
		{Name: "default/web:http", Protocol: TCP, Port: 30080, NodePort: true, ProxyPort: 40001},
		{Name: "kube-system/dns:dns", Protocol: UDP, IP: netip.MustParseAddr("10.96.0.53"), Port: 53, ProxyPort: 40002},
		{Name: "kube-system/dns:dns-tcp", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.53"), Port: 53, ProxyPort: 40003},
	}
}

// localPolicyPortals is a Service with externalTrafficPolicy: Local: its
// ClusterIP on the cluster-wide socket (40001), its externalIP, LB IP and
// NodePort on the Local one (40002) with the shortcut to 40001 for the
// node and pods; a UDP port of the same kind beside it; the accept of its
// healthCheckNodePort, 30301, for each port (the UDP port's given as UDP,
// rendered as TCP).
func localPolicyPortals() []Portal {
	return []Portal{
		{Name: "default/lb:http", Protocol: TCP, Port: 30301, HealthCheck: true},
		{Name: "default/lb:dns", Protocol: UDP, Port: 30301, HealthCheck: true},
		{Name: "default/lb:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40001},
		{Name: "default/lb:http", Protocol: TCP, IP: netip.MustParseAddr("203.0.113.7"), Port: 80, ProxyPort: 40002, ClusterProxyPort: 40001},
		{Name: "default/lb:http", Protocol: TCP, IP: netip.MustParseAddr("198.51.100.20"), Port: 80, ProxyPort: 40002, ClusterProxyPort: 40001},
		{Name: "default/lb:http", Protocol: TCP, Port: 30080, NodePort: true, ProxyPort: 40002, ClusterProxyPort: 40001},
		{Name: "default/lb:dns", Protocol: UDP, IP: netip.MustParseAddr("10.96.0.10"), Port: 53, ProxyPort: 40003},
		{Name: "default/lb:dns", Protocol: UDP, IP: netip.MustParseAddr("198.51.100.20"), Port: 53, ProxyPort: 40004, ClusterProxyPort: 40003},
	}
}

func dualStackPortals() []Portal {
	return []Portal{
		{Name: "default/dual:http", Protocol: TCP, IP: netip.MustParseAddr("fd00:96::10"), Port: 80, ProxyPort: 41001},
		{Name: "default/dual:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.11"), Port: 80, ProxyPort: 40011},
		{Name: "default/dual:http", Protocol: TCP, Port: 30081, NodePort: true, ProxyPort: 41001},
		{Name: "default/dual:dns", Protocol: UDP, IP: netip.MustParseAddr("fd00:96::53"), Port: 53, ProxyPort: 41002},
	}
}

// sourceRangePortals is a LoadBalancer Service whose
// loadBalancerSourceRanges allow 10.1.0.0/16 and the node's own subnet (so
// also its LB IP as source), served on 40001 beside its ClusterIP and
// NodePort; a UDP port with IPv6 ranges only (so none of IPv4: every
// source); one allowing every IPv4 source (no rules); and a dual-stack one
// whose IPv6 LB IP allows fd00:10::/64 (masked from fd00:10::1/64).
func sourceRangePortals() []Portal {
	ranges := []netip.Prefix{netip.MustParsePrefix("10.1.2.3/16"), netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("fd00:10::1/64")}
	return []Portal{
		{Name: "default/lb:http", Protocol: TCP, IP: netip.MustParseAddr("10.96.0.10"), Port: 80, ProxyPort: 40001},
		{Name: "default/lb:http", Protocol: TCP, IP: netip.MustParseAddr("198.51.100.20"), Port: 80, ProxyPort: 40001, SourceRanges: ranges},
		{Name: "default/lb:http", Protocol: TCP, IP: netip.MustParseAddr("fd00:96::20"), Port: 80, ProxyPort: 40001, SourceRanges: ranges},
		{Name: "default/lb:http", Protocol: TCP, Port: 30080, NodePort: true, ProxyPort: 40001},
		{Name: "default/lb:dns", Protocol: UDP, IP: netip.MustParseAddr("198.51.100.20"), Port: 53, ProxyPort: 40002,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("fd00:10::/64")}},
		{Name: "default/open:http", Protocol: TCP, IP: netip.MustParseAddr("198.51.100.21"), Port: 80, ProxyPort: 40003,
			SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("0.0.0.0/0")}},
	}
}

func TestRenderGolden(t *testing.T) {
	nodeIP := netip.MustParseAddr("192.168.1.10")
	tests := []struct {
		name    string
		cfg     Config
		portals []Portal
	}{
		{"empty", Config{Family: IPv4, NodeIP: nodeIP}, nil},
		{"bind-all", Config{Family: IPv4, BindAddress: netip.IPv4Unspecified(), NodeIP: nodeIP}, webPortals()},
		{"bind-all-prerouting-redirect", Config{Family: IPv4, NodeIP: nodeIP, PreroutingRedirect: true}, webPortals()},
		{"bind-specific", Config{Family: IPv4, BindAddress: netip.MustParseAddr("192.168.1.10")}, webPortals()},
		{"no-node-ip", Config{Family: IPv4}, webPortals()},
		{"nodeport-addresses", Config{Family: IPv4, NodeIP: nodeIP, NodePortAddresses: []netip.Prefix{
			netip.MustParsePrefix("192.168.1.0/24"),
			netip.MustParsePrefix("10.0.0.1/8"), // masked to 10.0.0.0/8
			netip.MustParsePrefix("fd00::/64"),  // other family: ignored
		}}, webPortals()},
		{"ipv6", Config{Family: IPv6, BindAddress: netip.IPv6Unspecified(), NodeIP: netip.MustParseAddr("fd00:1::10"),
			NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("fd00:1::/64")}}, dualStackPortals()},
		{"local-policy", Config{Family: IPv4, NodeIP: nodeIP, ClusterCIDRs: []netip.Prefix{
			netip.MustParsePrefix("10.244.0.0/16"),
			netip.MustParsePrefix("fd00:244::/56"), // other family: ignored
		}}, localPolicyPortals()},
		{"local-policy-nodeport-addresses-no-cluster-cidr", Config{Family: IPv4, NodeIP: nodeIP,
			NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}}, localPolicyPortals()},
		{"ipv6-bind-specific", Config{Family: IPv6, BindAddress: netip.MustParseAddr("fd00:1::10")}, dualStackPortals()},
		{"source-ranges", Config{Family: IPv4, NodeIP: nodeIP}, sourceRangePortals()},
		{"source-ranges-ipv6", Config{Family: IPv6, NodeIP: netip.MustParseAddr("fd00:1::10")}, sourceRangePortals()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := New(NewFakeRunner(tt.cfg.Family), tt.cfg).Render(tt.portals)
			path := filepath.Join("testdata", tt.name+".golden")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./iptables -run TestRenderGolden -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("render differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

// TestIPv6NodePortsLeaveLoopbackOut: with every local address taking
// NodePorts, the IPv6 NodePort rules leave ::1 out, as kube-proxy's jump
// to KUBE-NODEPORTS does ("! -d ::1/128": localhost NodePorts never work
// for IPv6 there), so the node's own connection to [::1]:NodePort is not
// the Service's. IPv4 keeps 127.0.0.1 (kube-proxy's localhostNodePorts),
// and --nodeport-addresses CIDRs are as given.
func TestIPv6NodePortsLeaveLoopbackOut(t *testing.T) {
	nodePortRules := func(cfg Config) []string {
		var out []string
		for _, line := range strings.Split(string(New(NewFakeRunner(cfg.Family), cfg).Render(dualStackPortals())), "\n") {
			if strings.HasPrefix(line, "-A KUBE-NODEPORT-HOST ") || strings.HasPrefix(line, "-A KUBE-NODEPORT-CONTAINER ") {
				out = append(out, line)
			}
		}
		if len(out) == 0 {
			t.Fatalf("%v: no NodePort rules", cfg.Family)
		}
		return out
	}
	for _, line := range nodePortRules(Config{Family: IPv6, NodeIP: netip.MustParseAddr("fd00:1::10")}) {
		if !strings.Contains(line, " ! -d ::1/128 -p tcp ") {
			t.Errorf("IPv6 NodePort rule does not leave ::1 out: %s", line)
		}
		if d := Describe(line); !strings.Contains(d, "on any local address but ::1,") {
			t.Errorf("%s described as %q", line, d)
		}
	}
	for _, line := range nodePortRules(Config{Family: IPv4, NodeIP: netip.MustParseAddr("192.168.1.10")}) {
		if strings.Contains(line, "! -d") {
			t.Errorf("IPv4 NodePort rule leaves an address out: %s", line)
		}
	}
	restricted := Config{Family: IPv6, NodeIP: netip.MustParseAddr("fd00:1::10"), NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("fd00:1::/64")}}
	for _, line := range nodePortRules(restricted) {
		if !strings.Contains(line, " -d fd00:1::/64 -p tcp ") || strings.Contains(line, "! -d") {
			t.Errorf("IPv6 NodePort rule under --nodeport-addresses: %s", line)
		}
	}
}

// TestIPv6LocalhostNodePortAddressLeftOut: --nodeport-addresses localhost
// (127.0.0.0/8 and ::1/128, kube-proxy's keyword; primary,localhost is its
// documented way to keep localhost NodePorts) gives IPv4 its loopback
// NodePorts, but in IPv6 kube-proxy skips a loopback node IP ("localhost
// NodePorts are not supported on IPv6"), so [::1]:NodePort is not the
// Service's there either: the IPv6 rules keep the node's other CIDRs,
// and with ::1 alone have no NodePort rule (the family stays restricted).
func TestIPv6LocalhostNodePortAddressLeftOut(t *testing.T) {
	rules := func(cfg Config) []string {
		var out []string
		for _, line := range strings.Split(string(New(NewFakeRunner(cfg.Family), cfg).Render(dualStackPortals())), "\n") {
			if strings.HasPrefix(line, "-A KUBE-NODEPORT-HOST ") || strings.HasPrefix(line, "-A KUBE-NODEPORT-CONTAINER ") {
				out = append(out, line)
			}
		}
		return out
	}
	localhost := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
	primary := append(slices.Clone(localhost), netip.MustParsePrefix("fd00:1::10/128"))
	got := rules(Config{Family: IPv6, NodeIP: netip.MustParseAddr("fd00:1::10"), NodePortAddresses: primary})
	if len(got) != 2 {
		t.Errorf("primary,localhost: IPv6 NodePort rules %q, want the two for fd00:1::10/128 alone", got)
	}
	for _, line := range got {
		if !strings.Contains(line, " -d fd00:1::10/128 ") {
			t.Errorf("primary,localhost: IPv6 NodePort rule %s, want -d fd00:1::10/128 (no ::1: kube-proxy serves no IPv6 localhost NodePort)", line)
		}
	}
	if got := rules(Config{Family: IPv6, NodeIP: netip.MustParseAddr("fd00:1::10"), NodePortAddresses: localhost}); len(got) != 0 {
		t.Errorf("localhost: IPv6 NodePort rules %q, want none", got)
	}
	got = rules(Config{Family: IPv4, NodeIP: netip.MustParseAddr("192.168.1.10"), NodePortAddresses: localhost})
	if len(got) == 0 {
		t.Fatal("localhost: no IPv4 NodePort rule")
	}
	for _, line := range got {
		if !strings.Contains(line, " -d 127.0.0.0/8 ") {
			t.Errorf("localhost: IPv4 NodePort rule %s, want -d 127.0.0.0/8 (kube-proxy's localhostNodePorts)", line)
		}
	}
}

func TestRenderIsIndependentOfPortalOrder(t *testing.T) {
	r := New(NewFakeRunner(IPv4), Config{Family: IPv4, NodeIP: netip.MustParseAddr("192.168.1.10")})
	portals := webPortals()
	reversed := make([]Portal, len(portals))
	for i, p := range portals {
		reversed[len(portals)-1-i] = p
	}
	if a, b := r.Render(portals), r.Render(reversed); !bytes.Equal(a, b) {
		t.Errorf("render depends on portal order:\n%s\nvs\n%s", a, b)
	}
}

func TestRenderSkipsUnusablePortals(t *testing.T) {
	r := New(NewFakeRunner(IPv4), Config{Family: IPv4})
	empty := r.Render(nil)
	ip := netip.MustParseAddr("10.0.0.1")
	for _, p := range []Portal{
		{Name: "a/b:c", Protocol: TCP, IP: ip, Port: 0, ProxyPort: 1},
		{Name: "a/b:c", Protocol: TCP, IP: ip, Port: 80, ProxyPort: 0},
		{Name: "a/b:c", Protocol: TCP, IP: ip, Port: 80, ProxyPort: 70000},
		{Name: "a/b:c", Protocol: "", IP: ip, Port: 80, ProxyPort: 1},
		{Name: "a/b:c", Protocol: TCP, Port: 80, ProxyPort: 1},                                     // no IP and not a NodePort
		{Name: "a/b:c", Protocol: TCP, IP: netip.MustParseAddr("fd00::1"), Port: 80, ProxyPort: 1}, // other family
	} {
		if got := r.Render([]Portal{p}); !bytes.Equal(got, empty) {
			t.Errorf("portal %+v rendered rules:\n%s", p, got)
		}
	}
}

// TestFamilyCIDRsUnmapsPrefixes: an IPv4-mapped CIDR (::ffff:10.0.0.0/104,
// accepted by the flag parser) is the IPv4 prefix it maps; rendered as it
// came it made an invalid prefix, and iptables-restore refused the whole nat
// table: no IPv4 portal at all.
func TestFamilyCIDRsUnmapsPrefixes(t *testing.T) {
	c4 := Config{Family: IPv4}
	got := c4.familyCIDRs([]netip.Prefix{
		netip.MustParsePrefix("::ffff:10.0.0.0/104"),
		netip.MustParsePrefix("::ffff:0.0.0.0/80"), // wider than IPv4: left out
		netip.MustParsePrefix("192.168.0.0/16"),
		netip.MustParsePrefix("fd00::/64"), // the other family
	})
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")}
	if !slices.Equal(got, want) {
		t.Errorf("IPv4 CIDRs %v, want %v", got, want)
	}
}

// TestLinkLocalNodeIPRedirectsPrerouting: an IPv6 link-local node IP is
// local only on its own link, so a PREROUTING DNAT to it sent the traffic
// of pods and hosts on every other link out again (forwarded, lost). Those
// portals REDIRECT to the arrival interface's own address instead. So do
// the node's own (OUTPUT), to the loopback address: rerouted after a DNAT
// to a link-local address, a packet is pinned to the device of its first
// route, so the node's connection to its own NodePort on any other
// address (or [::1]), and to a Service address routed out of another
// interface, was sent out of that link and lost.
func TestLinkLocalNodeIPRedirectsPrerouting(t *testing.T) {
	cfg := Config{Family: IPv6, BindAddress: netip.IPv6Unspecified(), NodeIP: netip.MustParseAddr("fe80::1")}
	got := string(New(NewFakeRunner(IPv6), cfg).Render(dualStackPortals()))
	for _, line := range strings.Split(got, "\n") {
		container := strings.HasPrefix(line, "-A "+ChainPortalsContainer+" ") || strings.HasPrefix(line, "-A "+ChainNodePortContainer+" ")
		host := strings.HasPrefix(line, "-A "+ChainPortalsHost+" ") || strings.HasPrefix(line, "-A "+ChainNodePortHost+" ")
		switch {
		case container && !strings.Contains(line, "-j REDIRECT --to-ports "):
			t.Errorf("PREROUTING portal to a link-local node IP does not REDIRECT:\n%s", line)
		case host && !strings.Contains(line, "-j REDIRECT --to-ports "):
			t.Errorf("OUTPUT portal to a link-local node IP does not REDIRECT:\n%s", line)
		}
	}
	// A global (ULA) node IP keeps the DNAT from PREROUTING.
	cfg.NodeIP = netip.MustParseAddr("fd00:1::10")
	got = string(New(NewFakeRunner(IPv6), cfg).Render(dualStackPortals()))
	if !strings.Contains(got, "-A "+ChainPortalsContainer+" -d fd00:96::10/128 -p tcp -m comment --comment \"default/dual:http\" -m tcp --dport 80 -j DNAT --to-destination [fd00:1::10]:41001") {
		t.Errorf("PREROUTING portal to a global node IP does not DNAT:\n%s", got)
	}
	if !strings.Contains(got, "-A "+ChainPortalsHost+" -d fd00:96::10/128 -p tcp -m comment --comment \"default/dual:http\" -m tcp --dport 80 -j DNAT --to-destination [fd00:1::10]:41001") {
		t.Errorf("OUTPUT portal to a global node IP does not DNAT:\n%s", got)
	}
}

// TestLoopbackNodePortAddressesTakeOnlyTheNodesOwn: a --nodeport-addresses
// CIDR of loopback addresses only (the localhost keyword's 127.0.0.0/8, a
// 127.0.0.1/32) gets its NodePort rules in KUBE-NODEPORT-HOST (OUTPUT) alone:
// only the node's own connections have such a destination, and a
// PREROUTING rule DNATed a neighbour's packet to 127.0.0.1:NodePort to the
// node IP before routing could drop the martian, so every host on the
// node's links reached NodePorts meant for the node. Other CIDRs keep both
// chains, an externalTrafficPolicy: Local portal's pod shortcut included.
func TestLoopbackNodePortAddressesTakeOnlyTheNodesOwn(t *testing.T) {
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		cidrs       []netip.Prefix
		host, other string // -d of the rules in HOST alone, and in both chains ("": none)
	}{
		{[]netip.Prefix{p("127.0.0.0/8"), p("::1/128")}, "127.0.0.0/8", ""},
		{[]netip.Prefix{p("127.0.0.1/32")}, "127.0.0.1/32", ""},
		{[]netip.Prefix{p("127.0.0.0/8"), p("192.168.1.0/24")}, "127.0.0.0/8", "192.168.1.0/24"},
	} {
		cfg := Config{Family: IPv4, NodeIP: netip.MustParseAddr("192.168.1.10"), NodePortAddresses: tc.cidrs,
			ClusterCIDRs: []netip.Prefix{p("10.244.0.0/16")}}
		chains := map[string][]string{}
		for _, line := range strings.Split(string(New(NewFakeRunner(cfg.Family), cfg).Render(localPolicyPortals())), "\n") {
			for _, chain := range []string{ChainNodePortContainer, ChainNodePortHost} {
				if rule, ok := strings.CutPrefix(line, "-A "+chain+" "); ok {
					chains[chain] = append(chains[chain], rule)
				}
			}
		}
		if !slices.ContainsFunc(chains[ChainNodePortHost], func(r string) bool { return strings.Contains(r, "-d "+tc.host+" ") }) {
			t.Errorf("%v: no KUBE-NODEPORT-HOST rule for %s (the node's own clients): %q", tc.cidrs, tc.host, chains[ChainNodePortHost])
		}
		for _, rule := range chains[ChainNodePortContainer] {
			if strings.Contains(rule, "-d 127.") {
				t.Errorf("%v: KUBE-NODEPORT-CONTAINER (PREROUTING) rule for a loopback destination, which DNATs a neighbour's packet to 127.0.0.1: %s", tc.cidrs, rule)
			}
		}
		if tc.other == "" {
			continue
		}
		for _, chain := range []string{ChainNodePortContainer, ChainNodePortHost} {
			if !slices.ContainsFunc(chains[chain], func(r string) bool { return strings.Contains(r, "-d "+tc.other+" ") }) {
				t.Errorf("%v: no %s rule for %s: %q", tc.cidrs, chain, tc.other, chains[chain])
			}
		}
		if !slices.ContainsFunc(chains[ChainNodePortContainer], func(r string) bool {
			return strings.HasPrefix(r, "-s 10.244.0.0/16 -d "+tc.other+" ")
		}) {
			t.Errorf("%v: the Local portal's pod shortcut for %s is gone: %q", tc.cidrs, tc.other, chains[ChainNodePortContainer])
		}
	}
}

// TestNodePortCapturesAsRendered: Config.NodePortCaptures, which the
// proxy's own-portal check asks, says of each local address what the
// rendered KUBE-NODEPORT-HOST rules (the node's own connections) do with
// it: IPv6's ::1 left out, --nodeport-addresses CIDRs of the family alone,
// ::1/128 taking none, the other family's CIDRs ignored.
func TestNodePortCapturesAsRendered(t *testing.T) {
	p := netip.MustParsePrefix
	addrs := []string{"127.0.0.1", "127.0.0.2", "192.168.1.10", "10.0.0.1", "::1", "fd00:1::10", "fd00:2::10", "::ffff:192.168.1.10"}
	for _, cfg := range []Config{
		{Family: IPv4},
		{Family: IPv6},
		{Family: IPv4, NodePortAddresses: []netip.Prefix{p("192.168.1.0/24"), p("fd00:1::/64")}},
		{Family: IPv6, NodePortAddresses: []netip.Prefix{p("192.168.1.0/24"), p("fd00:1::/64")}},
		{Family: IPv4, NodePortAddresses: []netip.Prefix{p("127.0.0.0/8"), p("::1/128")}},
		{Family: IPv6, NodePortAddresses: []netip.Prefix{p("127.0.0.0/8"), p("::1/128")}},
		{Family: IPv6, NodePortAddresses: []netip.Prefix{p("::1/128"), p("fd00:1::10/128")}},
		{Family: IPv6, NodePortAddresses: []netip.Prefix{p("::/1")}},
		{Family: IPv4, NodePortAddresses: []netip.Prefix{p("fd00:1::/64")}}, // none of IPv4: every address
	} {
		var dsts []string
		for _, line := range strings.Split(string(New(NewFakeRunner(cfg.Family), cfg).Render(dualStackPortals())), "\n") {
			if rule, ok := strings.CutPrefix(line, "-A KUBE-NODEPORT-HOST "); ok && strings.Contains(rule, "--dport 30081 ") {
				dst, _, _ := strings.Cut(rule, "-p tcp ")
				dsts = append(dsts, dst)
			}
		}
		for _, a := range addrs {
			ip := netip.MustParseAddr(a)
			rendered := false
			for _, dst := range dsts {
				switch {
				case dst == "":
					rendered = rendered || cfg.Family.owns(ip)
				case strings.HasPrefix(dst, "! -d "):
					rendered = rendered || cfg.Family.owns(ip) && !p(strings.TrimSpace(dst[len("! -d "):])).Contains(ip.Unmap())
				default:
					rendered = rendered || p(strings.TrimSpace(dst[len("-d "):])).Contains(ip.Unmap())
				}
			}
			if got := cfg.NodePortCaptures(ip); got != rendered {
				t.Errorf("%v %v: NodePortCaptures(%s) = %v; the rules %q take it: %v", cfg.Family, cfg.NodePortAddresses, a, got, dsts, rendered)
			}
		}
	}
}
