package config

import (
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestParseObjectIP: addresses of objects from the cluster are read as
// kube-proxy reads them (k8s.io/utils/net ParseIPSloppy): leading zeros,
// which an older API server stored, as decimal; mapped IPv4 unmapped; a
// zone or garbage refused.
func TestParseObjectIP(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1": "10.0.0.1", "010.0.0.1": "10.0.0.1", "10.0.0.01": "10.0.0.1", "10.0.0.09": "10.0.0.9",
		"::ffff:10.0.0.1": "10.0.0.1", "2001:db8::1": "2001:db8::1", "2001:db8::010.0.0.1": "2001:db8::a00:1",
		"fe80::1%eth0": "", "10.0.0.256": "", "": "", "abc": "",
	} {
		a, ok := ParseObjectIP(in)
		if got := map[bool]string{true: a.String(), false: ""}[ok]; got != want {
			t.Errorf("ParseObjectIP(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"10.0.0.0/8": "10.0.0.0/8", " 010.0.0.0/8 ": "10.0.0.0/8", "10.1.2.3/16": "10.1.0.0/16",
		"2001:db8::/32": "2001:db8::/32", "10.0.0.0/33": "", "abc": "",
	} {
		p, ok := ParseObjectPrefix(in)
		if got := map[bool]string{true: p.String(), false: ""}[ok]; got != want {
			t.Errorf("ParseObjectPrefix(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLeadingZeroObjects: a Node's address, and a state file's Service and
// slice, with leading zeros an older API server stored are kept, read as
// kube-proxy reads them; the manifests source still refuses them, as an
// API server does today.
func TestLeadingZeroObjects(t *testing.T) {
	node := &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.001.10"}}}}
	if got := nodeInfo(node, false).Addresses; len(got) != 1 || got[0] != netip.MustParseAddr("192.168.1.10") {
		t.Errorf("node addresses %v, want [192.168.1.10]", got)
	}

	svc := stateService("web", "010.96.0.10")
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.ExternalIPs = []string{"192.000.2.10"}
	svc.Spec.LoadBalancerSourceRanges = []string{"010.0.0.0/8"}
	stateFileKeeps(t, svc, stateSlice("web", "web-1", "10.1.0.01"))

	if err := validStateObject(stateSlice("web", "web-2", "10.1.0.0x1")); err == nil {
		t.Error("a state slice with address 10.1.0.0x1 is valid")
	}
	var fe fieldErrors
	validateService(&fe, svc, PortRange{Min: 1, Max: 65535})
	strict := 0
	for _, e := range fe {
		if e.strict {
			strict++
		}
	}
	if strict != 3 {
		t.Errorf("manifest validation of a Service with leading zeros: %v, want 3 errors (clusterIP, externalIP, source range)", fe.err())
	}
}
