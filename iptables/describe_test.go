package iptables

import (
	"net/netip"
	"strings"
	"testing"
)

// Every rule the renderer writes gets a sentence naming the traffic it
// catches (protocol, address or port) and what it does with it.
func TestDescribeRenderedRules(t *testing.T) {
	nodeIP := netip.MustParseAddr("192.168.1.10")
	for _, tc := range []struct {
		name    string
		cfg     Config
		portals []Portal
		want    map[string][]string // chain → words every description of its rules holds
	}{
		{"bind all", Config{Family: IPv4, NodeIP: nodeIP}, webPortals(), map[string][]string{
			ChainPortalsContainer:  {"service address", "from pods and other hosts", "proxy socket"},
			ChainPortalsHost:       {"service address", "sent by this node itself", "proxy socket"},
			ChainNodePortContainer: {"node port 30080 on any local address", "proxy socket"},
			ChainNodePortHost:      {"node port 30080", "sent by this node itself", "proxy socket"},
			ChainNodePortNonLocal:  {"TCP to proxy port 40001", "accepts it"},
			ChainProxyPortGuard:    {"did not come through", "drops it", "back door"},
			ChainPortalsNonLocal:   {"to proxy port 4000", "after a service address rule", "accepts it"},
			ChainProxyPortReject:   {"to proxy port 4000", "no accept above took", "refuses it"},
		}},
		{"bind one address, node ports limited", Config{Family: IPv4, BindAddress: netip.MustParseAddr("192.168.1.10"),
			NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}}, webPortals(), map[string][]string{
			ChainPortalsContainer:  {"rewrites its destination to the proxy socket 192.168.1.10:"},
			ChainNodePortContainer: {"a local address in 192.168.1.0/24"},
		}},
		{"externalTrafficPolicy Local", Config{Family: IPv4, NodeIP: nodeIP, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}},
			localPolicyPortals(), map[string][]string{
				ChainPortalsHost: {"sent by this node itself", "proxy socket"},
			}},
		{"healthCheckNodePort", Config{Family: IPv4, NodeIP: nodeIP, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}},
			[]Portal{{Name: "default/lb:http", Port: 30301, HealthCheck: true}}, map[string][]string{
				ChainNodePortNonLocal: {"TCP to healthCheckNodePort 30301 on a local address in 192.168.1.0/24", "where load balancers check default/lb:http", "accepts it"},
			}},
		{"loadBalancerSourceRanges", Config{Family: IPv4, NodeIP: nodeIP}, sourceRangePortals(), map[string][]string{
			ChainLBSourceRanges: {"to the LoadBalancer IP 198.51.100.20 port 80", "loadBalancerSourceRanges"},
		}},
		{"IPv6", Config{Family: IPv6}, dualStackPortals(), map[string][]string{
			ChainPortalsContainer: {"to the service address fd00:96::"},
		}},
		// Without a node IP the portals REDIRECT: PREROUTING's to the
		// address a packet arrived on, OUTPUT's to loopback (the node's own
		// packets arrive on no interface; it said "of the address it
		// arrived on" for those too).
		{"no node IP", Config{Family: IPv4}, webPortals(), map[string][]string{
			ChainPortalsContainer: {"of the address it arrived on"},
			ChainPortalsHost:      {"sent by this node itself", "redirects it to the proxy socket 127.0.0.1:4000", "(loopback: REDIRECT of the node's own traffic)"},
			ChainNodePortHost:     {"sent by this node itself", "of the loopback address, 127.0.0.1 or ::1"},
		}},
		{"no node IP, IPv6", Config{Family: IPv6}, dualStackPortals(), map[string][]string{
			ChainPortalsHost: {"redirects it to the proxy socket [::1]:"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := New(NewFakeRunner(tc.cfg.Family), tc.cfg).Render(tc.portals)
			seen := map[string]bool{}
			for _, line := range strings.Split(string(out), "\n") {
				if !strings.HasPrefix(line, "-A ") {
					continue
				}
				chain := strings.Fields(line)[1]
				seen[chain] = true
				d := Describe(line)
				if strings.Contains(d, "rule in") || strings.Contains(d, "jumps to") {
					t.Errorf("%s: generic description %q", line, d)
				}
				for _, w := range tc.want[chain] {
					if !strings.Contains(d, w) {
						t.Errorf("%s\n  described as %q, want it to say %q", line, d, w)
					}
				}
			}
			for chain := range tc.want {
				if !seen[chain] {
					t.Errorf("no rule in %s rendered", chain)
				}
			}
		})
	}
}

// A pod shortcut rule says whose traffic it catches.
func TestDescribePodShortcut(t *testing.T) {
	line := `-A KUBE-PORTALS-CONTAINER -s 10.244.0.0/16 -d 198.51.100.20/32 -p tcp -m comment --comment "default/lb:http" -m tcp --dport 80 -j DNAT --to-destination 192.168.1.10:40001`
	got := Describe(line)
	for _, w := range []string{"from pods in 10.244.0.0/16", "198.51.100.20 port 80", "192.168.1.10:40001"} {
		if !strings.Contains(got, w) {
			t.Errorf("Describe = %q, want it to hold %q", got, w)
		}
	}
}

func TestDescribeBuckets(t *testing.T) {
	r := New(NewFakeRunner(IPv4), testConfig)
	r.bucketAbove = 2
	out := string(r.Render(webPortals()))
	for line := range strings.Lines(out) {
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		got := Describe(strings.TrimSpace(line))
		if strings.Contains(line, "-j "+ChainPortalsContainer+"-") && !strings.Contains(got, "buckets") {
			t.Errorf("%s: described as %q", line, got)
		}
		if strings.Contains(line, "--comment") && strings.Contains(got, "rule in") {
			t.Errorf("%s: bucket rule not described as its chain's: %q", line, got)
		}
	}
}
