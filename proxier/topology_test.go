package proxier

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// TestTopologyFiltered is kube-proxy's rule for hints (topologyModeFromHints):
// node hints are used when every ready endpoint has some and at least one
// READY endpoint is hinted for this node, whatever the Service's
// trafficDistribution; else zone hints likewise for this node's zone.
// Non-ready endpoints neither switch hints on nor off.
func TestTopologyFiltered(t *testing.T) {
	type ep struct {
		ip          string
		ready       bool
		zones, node []string
	}
	tests := []struct {
		name string
		eps  []ep
		zone string
		want []string
	}{
		{"ready endpoint hinted for this zone",
			[]ep{{"10.0.0.1", true, []string{"a"}, nil}, {"10.0.0.2", true, []string{"b"}, nil}}, "a",
			[]string{"10.0.0.1"}},
		{"only a NON-ready endpoint hinted for this zone: hints off",
			[]ep{{"10.0.0.1", false, []string{"a"}, nil}, {"10.0.0.2", true, []string{"b"}, nil}}, "a",
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"a non-ready hinted endpoint is not kept beside ready ones",
			[]ep{{"10.0.0.1", false, []string{"a"}, nil}, {"10.0.0.2", true, []string{"a"}, nil}, {"10.0.0.3", true, []string{"b"}, nil}}, "a",
			[]string{"10.0.0.2"}},
		{"a ready endpoint without hints: hints off",
			[]ep{{"10.0.0.1", true, []string{"a"}, nil}, {"10.0.0.2", true, nil, nil}}, "a",
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"a non-ready endpoint without hints does not switch hints off",
			[]ep{{"10.0.0.1", true, []string{"a"}, nil}, {"10.0.0.2", false, nil, nil}, {"10.0.0.3", true, []string{"b"}, nil}}, "a",
			[]string{"10.0.0.1"}},
		{"no zone known: hints off",
			[]ep{{"10.0.0.1", true, []string{"a"}, nil}, {"10.0.0.2", true, []string{"b"}, nil}}, "",
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"no endpoint for this zone: hints off",
			[]ep{{"10.0.0.1", true, []string{"b"}, nil}, {"10.0.0.2", true, []string{"c"}, nil}}, "a",
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"every ready endpoint node-hinted, one for this node",
			[]ep{{"10.0.0.1", true, []string{"a"}, []string{"node1"}}, {"10.0.0.2", true, []string{"a"}, []string{"node2"}}}, "a",
			[]string{"10.0.0.1"}},
		{"node hints without any zone known",
			[]ep{{"10.0.0.1", true, nil, []string{"node2"}}, {"10.0.0.2", true, nil, []string{"node1"}}}, "",
			[]string{"10.0.0.2"}},
		{"a ready endpoint without a node hint: zone hints decide",
			[]ep{{"10.0.0.1", true, []string{"a"}, []string{"node1"}}, {"10.0.0.2", true, []string{"a"}, nil}, {"10.0.0.3", true, []string{"b"}, nil}}, "a",
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"a ready endpoint without a node hint and no zone hints: all",
			[]ep{{"10.0.0.1", true, nil, []string{"node1"}}, {"10.0.0.2", true, nil, nil}}, "a",
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"node hints, none for this node: zone hints decide",
			[]ep{{"10.0.0.1", true, []string{"a"}, []string{"node2"}}, {"10.0.0.2", true, []string{"b"}, []string{"node3"}}}, "a",
			[]string{"10.0.0.1"}},
		{"node hint only on a non-ready endpoint: zone hints decide",
			[]ep{{"10.0.0.1", false, []string{"a"}, []string{"node1"}}, {"10.0.0.2", true, []string{"a"}, nil}, {"10.0.0.3", true, []string{"b"}, nil}}, "a",
			[]string{"10.0.0.2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var eps []loadbalancer.Endpoint
			for _, e := range tt.eps {
				eps = append(eps, loadbalancer.Endpoint{Addr: netip.AddrPortFrom(netip.MustParseAddr(e.ip), 80),
					Ready: e.ready, Serving: e.ready, ZoneHints: e.zones, NodeHints: e.node})
			}
			var got []string
			for _, e := range topologyFiltered(eps, nodeTopology{name: "node1", zone: tt.zone}) {
				got = append(got, e.Addr.Addr().String())
			}
			if want := tt.want; !slices.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}

// TestTopologyHintsPerFamily: whether hints are used is decided per address
// family, as kube-proxy's per-family proxiers each decide on their own
// family's endpoints (topologyModeFromHints), an IPv4-mapped address
// counting as IPv4. One family's missing hints do not switch hints off for
// the other, one family's endpoints hinted for this zone (or node) do not
// decide the other's set, and a family without a ready endpoint keeps its
// terminating ones for the balancer's per-family fallback.
func TestTopologyHintsPerFamily(t *testing.T) {
	type ep struct {
		ip          string
		ready       bool
		zones, node []string
	}
	a, b := []string{"a"}, []string{"b"}
	tests := []struct {
		name string
		eps  []ep
		want []string
	}{
		{"IPv6 without hints does not switch IPv4's off",
			[]ep{{"10.0.0.1", true, a, nil}, {"10.0.0.2", true, b, nil}, {"fd00::1", true, nil, nil}, {"fd00::2", true, nil, nil}},
			[]string{"10.0.0.1", "fd00::1", "fd00::2"}},
		{"IPv4 without hints does not switch IPv6's off",
			[]ep{{"10.0.0.1", true, nil, nil}, {"fd00::1", true, b, nil}, {"fd00::2", true, a, nil}},
			[]string{"10.0.0.1", "fd00::2"}},
		{"IPv6 hinted for this zone does not drop IPv4 hinted elsewhere",
			[]ep{{"10.0.0.1", true, b, nil}, {"10.0.0.2", true, b, nil}, {"fd00::1", true, a, nil}, {"fd00::2", true, b, nil}},
			[]string{"10.0.0.1", "10.0.0.2", "fd00::1"}},
		{"both families hinted: each filtered",
			[]ep{{"10.0.0.1", true, a, nil}, {"10.0.0.2", true, b, nil}, {"fd00::1", true, b, nil}, {"fd00::2", true, a, nil}},
			[]string{"10.0.0.1", "fd00::2"}},
		{"IPv6 with none ready keeps its terminating ones",
			[]ep{{"10.0.0.1", true, a, nil}, {"10.0.0.2", true, b, nil}, {"fd00::1", false, a, nil}},
			[]string{"10.0.0.1", "fd00::1"}},
		{"IPv4-mapped counts as IPv4",
			[]ep{{"::ffff:10.0.0.1", true, a, nil}, {"10.0.0.2", true, b, nil}, {"fd00::1", true, nil, nil}},
			[]string{"::ffff:10.0.0.1", "fd00::1"}},
		{"IPv4-mapped without hints switches IPv4's off, not IPv6's",
			[]ep{{"::ffff:10.0.0.1", true, nil, nil}, {"10.0.0.2", true, b, nil}, {"fd00::1", true, a, nil}, {"fd00::2", true, b, nil}},
			[]string{"::ffff:10.0.0.1", "10.0.0.2", "fd00::1"}},
		{"node hints in IPv4 only: IPv6 decided by its zone hints",
			[]ep{{"10.0.0.1", true, a, []string{"node1"}}, {"10.0.0.2", true, a, []string{"node2"}}, {"fd00::1", true, a, nil}, {"fd00::2", true, b, nil}},
			[]string{"10.0.0.1", "fd00::1"}},
		{"node hints in IPv6 only: IPv4 without hints keeps all",
			[]ep{{"10.0.0.1", true, nil, nil}, {"10.0.0.2", true, nil, nil}, {"fd00::1", true, a, []string{"node1"}}, {"fd00::2", true, a, []string{"node2"}}},
			[]string{"10.0.0.1", "10.0.0.2", "fd00::1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var eps []loadbalancer.Endpoint
			for _, e := range tt.eps {
				eps = append(eps, loadbalancer.Endpoint{Addr: netip.AddrPortFrom(netip.MustParseAddr(e.ip), 80),
					Ready: e.ready, Serving: true, Terminating: !e.ready, ZoneHints: e.zones, NodeHints: e.node})
			}
			var got []string
			for _, e := range topologyFiltered(eps, nodeTopology{name: "node1", zone: "a"}) {
				got = append(got, e.Addr.Addr().String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
