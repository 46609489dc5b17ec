package proxier

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kube-userspace-proxy/kube-userspace-proxy/loadbalancer"
)

// TestTopologyFiltered is kube-proxy's rule for hints: zone hints are used
// only when every ready endpoint has some and at least one READY endpoint is
// hinted for this node's zone; node hints (PreferSameNode) likewise need a
// ready endpoint hinted for this node. Non-ready endpoints neither switch
// hints on nor off.
func TestTopologyFiltered(t *testing.T) {
	type ep struct {
		ip          string
		ready       bool
		zones, node []string
	}
	tests := []struct {
		name       string
		eps        []ep
		zone       string
		preferNode bool
		want       []string
	}{
		{"ready endpoint hinted for this zone",
			[]ep{{"10.0.0.1", true, []string{"a"}, nil}, {"10.0.0.2", true, []string{"b"}, nil}}, "a", false,
			[]string{"10.0.0.1"}},
		{"only a NON-ready endpoint hinted for this zone: hints off",
			[]ep{{"10.0.0.1", false, []string{"a"}, nil}, {"10.0.0.2", true, []string{"b"}, nil}}, "a", false,
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"a non-ready hinted endpoint is not kept beside ready ones",
			[]ep{{"10.0.0.1", false, []string{"a"}, nil}, {"10.0.0.2", true, []string{"a"}, nil}, {"10.0.0.3", true, []string{"b"}, nil}}, "a", false,
			[]string{"10.0.0.2"}},
		{"a ready endpoint without hints: hints off",
			[]ep{{"10.0.0.1", true, []string{"a"}, nil}, {"10.0.0.2", true, nil, nil}}, "a", false,
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"a non-ready endpoint without hints does not switch hints off",
			[]ep{{"10.0.0.1", true, []string{"a"}, nil}, {"10.0.0.2", false, nil, nil}, {"10.0.0.3", true, []string{"b"}, nil}}, "a", false,
			[]string{"10.0.0.1"}},
		{"no zone known: hints off",
			[]ep{{"10.0.0.1", true, []string{"a"}, nil}, {"10.0.0.2", true, []string{"b"}, nil}}, "", false,
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"no endpoint for this zone: hints off",
			[]ep{{"10.0.0.1", true, []string{"b"}, nil}, {"10.0.0.2", true, []string{"c"}, nil}}, "a", false,
			[]string{"10.0.0.1", "10.0.0.2"}},
		{"node hint on a ready endpoint",
			[]ep{{"10.0.0.1", true, []string{"a"}, []string{"node1"}}, {"10.0.0.2", true, []string{"a"}, nil}}, "a", true,
			[]string{"10.0.0.1"}},
		{"node hint only on a non-ready endpoint: zone hints decide",
			[]ep{{"10.0.0.1", false, []string{"a"}, []string{"node1"}}, {"10.0.0.2", true, []string{"a"}, nil}, {"10.0.0.3", true, []string{"b"}, nil}}, "a", true,
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
			for _, e := range topologyFiltered(eps, nodeTopology{name: "node1", zone: tt.zone}, tt.preferNode) {
				got = append(got, e.Addr.Addr().String())
			}
			if want := tt.want; !slices.Equal(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}
